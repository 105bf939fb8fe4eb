import torch

# CI machines have 2 cores; one torch thread per test process is faster than two fighting.
torch.set_num_threads(1)
