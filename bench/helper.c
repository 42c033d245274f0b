/* The benchmark's child program: small, fast to start, exact timestamps.
 *
 * Every timestamp is CLOCK_MONOTONIC in seconds, the clock Python's
 * time.monotonic() reads, so the bench can subtract its own readings.
 *
 *   helper exit STAMPS MIN_MS MAX_MS GRAND_S
 *       sleep a random MIN..MAX ms; if GRAND_S > 0 first fork a grandchild that
 *       keeps stdout/stderr open for GRAND_S seconds; append "PID T" to STAMPS
 *       right before _exit(0).
 *   helper term STAMPS READY
 *       install a SIGTERM handler that appends "PID T" to STAMPS and _exits;
 *       create READY; wait for signals.
 *   helper storm N STAMPS
 *       double-fork N orphans that block on a pipe; once all exist, append
 *       "created T", release them all at once (close the pipe), append
 *       "released T", then wait forever (the storm's parent stays alive).
 *   helper spew BYTES LINE STAMPS
 *       write BYTES of LINE-byte lines to stdout in 64 KiB writes; the last line
 *       starts with "END"; append "start T0", "end T1", "cpu SECONDS" to STAMPS.
 *   helper start STAMPS
 *       append "PID T" (its own start), then wait forever.
 *   helper stampexec STAMPS PROG ARGS...
 *       append "exec T" to STAMPS, then execvp PROG (the supervisor).
 *   helper sink STAMPS
 *       read stdin to EOF as fast as it can (1 MiB reads); count lines that end
 *       in "x\n" (the spew lines; supervisors' own lines don't); append
 *       "endmark T" the moment the "ENDe x" marker line arrives, then at EOF
 *       "eof T", "lines N", "bytes N" to STAMPS.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* async-signal-safe enough: snprintf of a double is not formally, but the
 * handler below formats integers only. */
static void append_line(const char *path, const char *line) {
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ssize_t n = write(fd, line, strlen(line));
    (void)n;
    close(fd);
}

static void append_stamp(const char *path, const char *key, double t) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s %.9f\n", key, t);
    append_line(path, buf);
}

static void append_pid_stamp(const char *path) {
    char key[32];
    double t = mono();
    snprintf(key, sizeof key, "%d", (int)getpid());
    append_stamp(path, key, t);
}

static void append_pid_stamp_key(const char *path, const char *key) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s %d\n", key, (int)getpid());
    append_line(path, buf);
}

/* ------------------------------------------------------------ exit */

static int cmd_exit(int argc, char **argv) {
    if (argc < 6) return 2;
    const char *stamps = argv[2];
    int lo = atoi(argv[3]), hi = atoi(argv[4]);
    double grand = atof(argv[5]);
    if (grand > 0) {
        pid_t g = fork();
        if (g == 0) {
            /* keeps the inherited stdout/stderr pipes open */
            struct timespec ts = {(time_t)grand, (long)((grand - (time_t)grand) * 1e9)};
            nanosleep(&ts, NULL);
            _exit(0);
        }
    }
    srand((unsigned)(getpid() ^ (unsigned)(mono() * 1e6)));
    int ms = lo + (hi > lo ? rand() % (hi - lo + 1) : 0);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    /* the stamp: format first, then the last two syscalls before _exit */
    char buf[128];
    snprintf(buf, sizeof buf, "%d ", (int)getpid());
    int fd = open(stamps, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    double t = mono();
    size_t off = strlen(buf);
    snprintf(buf + off, sizeof buf - off, "%.9f\n", t);
    ssize_t n = write(fd, buf, strlen(buf));
    (void)n;
    _exit(0);
}

/* ------------------------------------------------------------ term */

static int term_fd = -1;

static void on_term(int sig) {
    (void)sig;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    /* integer formatting only: async-signal-safe */
    char buf[64];
    char *p = buf + sizeof buf;
    *--p = '\n';
    long ns = ts.tv_nsec;
    for (int i = 0; i < 9; i++) { *--p = (char)('0' + ns % 10); ns /= 10; }
    *--p = '.';
    long s = (long)ts.tv_sec;
    do { *--p = (char)('0' + s % 10); s /= 10; } while (s);
    *--p = ' ';
    long pid = (long)getpid();
    do { *--p = (char)('0' + pid % 10); pid /= 10; } while (pid);
    ssize_t n = write(term_fd, p, (size_t)(buf + sizeof buf - p));
    (void)n;
    _exit(0);
}

static int cmd_term(int argc, char **argv) {
    if (argc < 4) return 2;
    term_fd = open(argv[2], O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    int fd = open(argv[3], O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
    for (;;) pause();
}

/* ------------------------------------------------------------ storm */

static int cmd_storm(int argc, char **argv) {
    if (argc < 4) return 2;
    long n = atol(argv[2]);
    const char *stamps = argv[3];
    append_pid_stamp_key(stamps, "pid");
    int gate[2];
    if (pipe(gate) != 0) { perror("pipe"); return 1; }
    long made = 0;
    for (long i = 0; i < n; i++) {
        pid_t a = fork();
        if (a < 0) { perror("fork"); break; }
        if (a == 0) {
            pid_t g = fork();
            if (g == 0) {
                char c;
                close(gate[1]);
                while (read(gate[0], &c, 1) < 0 && errno == EINTR) {}
                _exit(0);
            }
            _exit(g < 0 ? 1 : 0);
        }
        int st;
        while (waitpid(a, &st, 0) < 0 && errno == EINTR) {}
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) made++;
    }
    char key[64];
    snprintf(key, sizeof key, "created %ld", made);
    append_stamp(stamps, key, mono());
    double t = mono();
    close(gate[1]);
    append_stamp(stamps, "released", t);
    close(gate[0]);
    for (;;) pause();
}

/* ------------------------------------------------------------ spew */

static int cmd_spew(int argc, char **argv) {
    if (argc < 5) return 2;
    long long total = atoll(argv[2]);
    int line = atoi(argv[3]);
    const char *stamps = argv[4];
    if (line < 8) line = 8;
    int per = (64 * 1024) / line;
    size_t chunk = (size_t)per * (size_t)line;
    char *buf = malloc(chunk);
    for (int i = 0; i < per; i++) {
        char *l = buf + (size_t)i * line;
        memset(l, 'x', (size_t)line - 1);
        memcpy(l, "line ", 5);
        l[line - 1] = '\n';
    }
    double t0 = mono();
    long long left = total - total % line;
    while (left > 0) {
        size_t want = left < (long long)chunk ? (size_t)left : chunk;
        if (want == (size_t)left) memcpy(buf + want - line, "END", 3); /* last line marked */
        size_t off = 0;
        while (off < want) {
            ssize_t w = write(1, buf + off, want - off);
            if (w < 0) {
                if (errno == EINTR) continue;
                perror("write");
                return 1;
            }
            off += (size_t)w;
        }
        left -= (long long)want;
    }
    double t1 = mono();
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    append_stamp(stamps, "start", t0);
    append_stamp(stamps, "end", t1);
    append_stamp(stamps, "cpu", ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
                                ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
    return 0;
}

/* ------------------------------------------------------------ start / stampexec */

static int cmd_start(int argc, char **argv) {
    if (argc < 3) return 2;
    append_pid_stamp(argv[2]);
    for (;;) pause();
}

static int cmd_stampexec(int argc, char **argv) {
    if (argc < 4) return 2;
    char key[] = "exec";
    int fd = open(argv[2], O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    char buf[64];
    double t = mono();
    snprintf(buf, sizeof buf, "%s %.9f\n", key, t);
    ssize_t n = write(fd, buf, strlen(buf));
    (void)n;
    close(fd);
    execvp(argv[3], argv + 3);
    perror("execvp");
    return 127;
}

/* ------------------------------------------------------------ sink */

static long long count_x_newlines(const unsigned char *b, size_t n, unsigned char prev) {
    long long c = 0;
    if (n == 0) return 0;
    c += (b[0] == '\n') & (prev == 'x');
    for (size_t i = 1; i < n; i++) c += (b[i] == '\n') & (b[i - 1] == 'x');
    return c;
}

static int cmd_sink(int argc, char **argv) {
    if (argc < 3) return 2;
    const char *stamps = argv[2];
    size_t cap = 1 << 20;
    unsigned char *buf = malloc(cap + 16);
    unsigned char carry[8] = {0};
    size_t carried = 0;
    long long lines = 0, bytes = 0;
    unsigned char prev = 0;
    double endmark = 0;
    static const char mark[] = "ENDe x";
    for (;;) {
        ssize_t n = read(0, buf + carried, cap);
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (n == 0) break;
        double t = mono();
        /* carry the previous chunk's tail so a marker split across reads is still found */
        if (carried) memcpy(buf, carry, carried);
        lines += count_x_newlines(buf + carried, (size_t)n, prev);
        prev = buf[carried + (size_t)n - 1];
        bytes += n;
        if (!endmark && memmem(buf, carried + (size_t)n, mark, sizeof mark - 1)) {
            endmark = t;
            append_stamp(stamps, "endmark", t); /* now: a supervisor that does not exit never sends EOF */
        }
        size_t tot = carried + (size_t)n;
        carried = tot < sizeof mark - 1 ? tot : sizeof mark - 1;
        memcpy(carry, buf + tot - carried, carried);
    }
    double t = mono();
    append_stamp(stamps, "eof", t);
    char key[64];
    snprintf(key, sizeof key, "lines %lld", lines);
    append_line(stamps, key); append_line(stamps, "\n");
    snprintf(key, sizeof key, "bytes %lld", bytes);
    append_line(stamps, key); append_line(stamps, "\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (!strcmp(argv[1], "exit")) return cmd_exit(argc, argv);
    if (!strcmp(argv[1], "term")) return cmd_term(argc, argv);
    if (!strcmp(argv[1], "storm")) return cmd_storm(argc, argv);
    if (!strcmp(argv[1], "spew")) return cmd_spew(argc, argv);
    if (!strcmp(argv[1], "start")) return cmd_start(argc, argv);
    if (!strcmp(argv[1], "stampexec")) return cmd_stampexec(argc, argv);
    if (!strcmp(argv[1], "sink")) return cmd_sink(argc, argv);
    fprintf(stderr, "helper: unknown command %s\n", argv[1]);
    return 2;
}
