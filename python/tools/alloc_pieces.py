"""Host cost of ways to allocate fused_topk's two [T, K] outputs (f32, i32) on the
current CUDA device, us per call (min of 5 repeats)."""
import timeit

import torch

T, K = 128, 8
dev = torch.device("cuda")
b32 = torch.empty(1, dtype=torch.float32, device=dev)
bi = torch.empty(1, dtype=torch.int32, device=dev)
pw, pi = b32.expand(T, K), bi.expand(T, K)
p2 = bi.expand(2, T, K)
e, f32 = torch.empty_like, torch.float32
sel = torch.Tensor.select
unbind = torch.Tensor.unbind
view = torch.Tensor.view


def two_empty_like():
    return e(pw), e(pi)


def one_empty_like_unbind_view():
    i, w = unbind(e(p2))
    return view(w, f32), i


def one_empty_like_select_view():
    buf = e(p2)
    return view(sel(buf, 0, 1), f32), sel(buf, 0, 0)


def one_empty_like_index():
    buf = e(p2)
    return buf[1], buf[0]


def noop():
    return None


for fn in (noop, two_empty_like, one_empty_like_unbind_view, one_empty_like_select_view,
           one_empty_like_index):
    n = 20000
    t = min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
    print(f"{fn.__name__:32s} {t:6.2f} us")
