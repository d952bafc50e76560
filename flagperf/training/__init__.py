"""The training family: a shared driver (PerfLog events, timers, convergence), a torchrun-compatible
launcher (nnodes x nproc_per_node processes, gloo on CPU, nccl on GPU), and the worker each process runs."""
