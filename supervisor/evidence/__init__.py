"""What the machine says, read off the loop and never blocking it: memory cgroups (v1 and v2), the GPU thread
(NVML samples, Xid events), /proc I/O bytes, file growth, a download's figures; each watch's own health
(watchstate.py), the stall and progress watches, and memory_high before an OOM kill.
"""
