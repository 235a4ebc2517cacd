#!/usr/bin/env python3
# Protocol model of the SM90 ping-pong GEMM kernel (src/gemm/sm90_pingpong.cuh, config 6):
# one producer and two consumer warpgroups on a PipelineTmaAsync of S stages (mbarrier
# parity semantics, cutlass PipelineState ++ / advance as in sm90_pipeline.hpp) and a
# cutlass::OrderedSequenceBarrier<1, 2>, under random interleavings. Checks: no deadlock,
# each consumer reads exactly its own tile's stages in k order (consumer 1 starts at
# advance(k_tiles), each skips the other's k_tiles after a tile), a stage is never
# refilled before its release, the two mainloops never overlap, every tile is stored
# once. Written while no GPU was available (2026-12-02): it checks the synchronization
# design, not the CUDA code. Mutations (no initial advance, no per-tile advance, no order
# arrive) make it fail. Run: python3 tests/models/sm90_pingpong_protocol.py
import random, sys

class Bar:
    def __init__(s, count): s.count=count; s.pending=count; s.phase=0
    def arrive(s):
        s.pending-=1
        assert s.pending>=0
        if s.pending==0: s.phase+=1; s.pending=s.count
    def done(s, parity):  # try_wait.parity
        return (s.phase & 1) != parity

class State:
    def __init__(s, S, idx=0, phase=0): s.S=S; s.index=idx; s.phase=phase
    def inc(s):
        s.index+=1
        if s.index==s.S: s.index=0; s.phase^=1
    def advance(s, n):
        S=s.S
        if n < S and s.index+n >= S: s.phase^=1
        if n >= S and ((s.index+n)//S) % 2 == 1: s.phase^=1
        s.index=(s.index+n)%S
    def copy(s): return State(s.S, s.index, s.phase)

def run(S, k_tiles, ntiles, seed):
    rnd=random.Random(seed)
    full=[Bar(1) for _ in range(S)]; empty=[Bar(1) for _ in range(S)]  # 1 arrival models 128 threads
    order=[Bar(1), Bar(1)]
    stage_data=[None]*S
    mma_active=[False, False]
    log=[]
    def producer():
        w=State(S,0,1)
        for j in range(ntiles):
            for kt in range(k_tiles):
                while not empty[w.index].done(w.phase): yield
                assert stage_data[w.index] is None, "overwrite"
                stage_data[w.index]=(j,kt)
                yield
                full[w.index].arrive()
                w.inc()
        for _ in range(S):
            while not empty[w.index].done(w.phase): yield
            w.inc()
    def consumer(wg):
        r=State(S)
        if wg==1: r.advance(k_tiles)
        ostate=State(1,0,1 if wg==0 else 0)
        for j in range(wg, ntiles, 2):
            while not order[wg].done(ostate.phase): yield
            mma_active[wg]=True
            assert not mma_active[1-wg], "mainloops interleave"
            rel=r.copy()
            pending=[]
            for kt in range(k_tiles):
                while not full[r.index].done(r.phase): yield
                assert stage_data[r.index]==(j,kt), (wg,j,kt,stage_data[r.index])
                pending.append(r.index)
                if kt>0:
                    i=pending.pop(0); assert i==rel.index
                    stage_data[rel.index]=None; empty[rel.index].arrive(); rel.inc()
                r.inc(); yield
            mma_active[wg]=False
            order[1-wg].arrive(); ostate.inc()
            yield
            i=pending.pop(0); assert i==rel.index and not pending
            stage_data[rel.index]=None; empty[rel.index].arrive()
            r.advance(k_tiles)
            for _ in range(rnd.randint(0,5)): yield   # epilogue
            log.append((wg,j))
    procs=[producer(), consumer(0), consumer(1)]
    alive=[True]*3; steps=0; stall=0
    while any(alive):
        i=rnd.randrange(3)
        if not alive[i]: continue
        try: next(procs[i])
        except StopIteration: alive[i]=False
        steps+=1
        if steps>2_000_000: raise RuntimeError("deadlock S=%d k=%d n=%d"%(S,k_tiles,ntiles))
    assert sorted(log)==sorted((j%2,j) for j in range(ntiles))
    return steps

n=0
for S in (5,4,3):
  for k in (1,2,3,4,5,6,7,8,9,10,11,16,33):
    for t in (0,1,2,3,4,5,7,10):
      for seed in range(3):
        run(S,k,t,seed); n+=1
print("ok", n, "runs")
