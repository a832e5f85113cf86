# The stream-ordered allocator as PyTorch's backend: every allocation is cudaMallocAsync
# from the driver's pool, every free cudaFreeAsync. Set before CUDA starts.
import os

os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
import torch  # noqa: E402

MiB = 2**20


def show(label):
    torch.cuda.synchronize()
    print(f"{label:30} allocated {torch.cuda.memory_allocated() / MiB:6.1f} MiB"
          f"   reserved {torch.cuda.memory_reserved() / MiB:6.1f} MiB")


print("backend:", torch.cuda.memory.get_allocator_backend())
show("start")
tensors = [torch.empty(10 * MiB, dtype=torch.uint8, device="cuda") for _ in range(10)]
show("ten 10 MiB tensors")
del tensors
show("all freed")
again = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
show("one 100 MiB tensor")
del again
torch.cuda.empty_cache()
show("freed, empty_cache")
stats = torch.cuda.memory_stats()
print("num_device_alloc:", stats.get("num_device_alloc"),
      "  num_device_free:", stats.get("num_device_free"))
