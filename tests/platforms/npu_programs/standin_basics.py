"""The real torch_npu on the stand-in runtime: availability and values of
common ops, copied back to the CPU. Prints one JSON line.

    python tests/platforms/npu_programs/standin_basics.py
"""
import json

import torch
import torch_npu  # noqa: F401  (torch autoloads it too)

import standin_controls as standin


def values(t: torch.Tensor) -> list:
    return t.cpu().tolist()


def main() -> dict:
    out = {"available": torch.npu.is_available(), "device_count": torch.npu.device_count()}
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    an = a.to("npu")
    b = torch.full((2, 3), 2.5, device="npu")
    out.update({
        "ones": values(torch.ones(2, 2, device="npu")),
        "zeros": values(torch.zeros(3, device="npu")),
        "full": values(b),
        "to_npu_and_back": values(an),
        "add": values(an + b),
        "add_scalar": values(an + 1),
        "add_alpha": values(torch.add(an, b, alpha=2)),
        "sub": values(an - b),
        "mul": values(an * b),
        "mul_scalar": values(an * 3),
        "broadcast_add": values(an + torch.tensor([10.0, 20.0, 30.0], device="npu")),
        "transpose_contiguous": values(an.t().contiguous()),
        "int64": values(torch.arange(5, device="npu") * 2),
        "to_int64": values(an.to(torch.int64)),
        "to_float16": values(an.to(torch.float16).to(torch.float32)),
        "bool": values(torch.ones(3, dtype=torch.bool, device="npu")),
        "sum": an.sum().item(),
        "sum_dim": values(an.sum(dim=1)),
        "mean_dim0": values(an.mean(dim=0)),
        "mm": values(an @ an.t()),
        "tanh_neg_abs": values(torch.tanh(-an).abs()),
        "equal": [torch.equal(an, an.clone()), torch.equal(an, an + 1)],
        "eq": values(an == torch.tensor([0.0, 4.0, 2.0], device="npu")),
        "compare_scalar": [values(an > 2), values(an >= 2), values(an < 2), values(an <= 2), values(an != 2)],
        "gt_tensor_broadcast": values(an > torch.tensor([[1.0], [4.0]], device="npu")),
        "gt_int_vs_real": values(torch.arange(3, device="npu") > -0.5),
        "gt_in_place": values(an.clone().gt_(2)),
        "isfinite": values(torch.isfinite(torch.tensor([1.0, float("inf"), float("nan"), -2.0]).npu())),
        "nonzero": values(torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]]).npu().nonzero()),
        "nonzero_none": list(torch.zeros(4, device="npu").nonzero().shape),
        "bool_of_a_comparison": bool(an[1, 2] > 4),
    })
    x = torch.zeros(4, device="npu")
    x.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    y = torch.empty(4, device="npu")
    y.copy_(x)
    y.mul_(2).add_(x)
    out["copy_chain"] = values(y)
    pinned = torch.arange(4, dtype=torch.float32).pin_memory()
    out["pinned_non_blocking"] = values(pinned.to("npu", non_blocking=True) + 0)
    r1 = torch.randn(1000, device="npu")
    r2 = torch.randn(1000, device="npu")
    out["randn"] = {"mean": r1.cpu().mean().item(), "std": r1.cpu().std().item(),
                    "differ": bool((r1.cpu() != r2.cpu()).any())}
    torch.manual_seed(7)
    s1 = values(torch.randn(4, device="npu"))
    torch.manual_seed(7)
    out["randn_seeded_repeat"] = s1 == values(torch.randn(4, device="npu"))
    out["rand_in_range"] = bool(((lambda t: (t >= 0).all() and (t < 1).all())(torch.rand(1000, device="npu").cpu())))
    out["kernel_calls"] = {name: standin.calls(name) for name in ("aclnnAdd", "aclnnMul", "aclnnInplaceCopy")}
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
