"""CUDA graphs of the decode step (`engine.cuda_graphs`), captured once per batch-size bucket
at start-up (graph_buckets.py) over the triton backend.

A decode step launches some fifteen kernels per layer; at 36 layers that is over a thousand
launches of ~10 us each, more than the step's arithmetic on an H200. A graph replays them in
one launch. What a graph reads lives in static buffers (token ids, positions, new slots,
table indices, rows, lengths), refilled by one host-to-device copy per step; what it writes
(the logits of every row) stays in the graph's memory until the next replay. Prefills and
mixed batches run eagerly.

The weights, the KV pool and the slot table are addressed in place, so a weight update
(copied in place) or new KV needs no new capture.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from venusrl.engine.attention.triton_backend import TritonBackend
from venusrl.engine.graph_buckets import DecodeStep, bucket_for, graph_buckets
from venusrl.model.causal_lm import CausalLM

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class CaptureReport:
    buckets: list[int]
    seconds: float
    memory_bytes: int  # device memory the graphs' pool reserved


class DecodeGraphs:
    def __init__(self, model: CausalLM, backend: TritonBackend, max_batch: int):
        self.model = model
        self.backend = backend
        self.buckets = graph_buckets(max_batch)
        self.max_batch = self.buckets[-1]
        device = backend.device
        pad_index, pad_row = backend.padding
        # rows: token ids, positions, new slots, new table indices, table rows, lengths
        self.inputs = torch.tensor(DecodeStep([], [], [], [], [], []).padded(self.max_batch, pad_index, pad_row),
                                   dtype=torch.long, device=device)
        self.q_rows = torch.arange(self.max_batch, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        # each bucket's forward, kept for the graphs' lifetime: its attention context owns
        # tensors made in the warm-up before capture (the decode kernel's split scratch) that
        # every replay writes; dropped, the allocator would hand their memory to others
        self.forwards: dict[int, Callable[[], torch.Tensor]] = {}
        self.report = self._capture()
        log.info("captured %d CUDA graphs of the decode step (batch sizes %s) in %.2f s, %.0f MiB",
                 len(self.buckets), ",".join(map(str, self.buckets)), self.report.seconds,
                 self.report.memory_bytes / 2**20)

    def _forward(self, size: int):
        ids, positions, new_slots, new_index, rows, lengths = (row[:size] for row in self.inputs)
        context = self.backend.decode_context(new_slots, rows, lengths, self.q_rows[:size])

        def forward() -> torch.Tensor:
            self.backend.write(new_index, new_slots)
            hidden = self.model.hidden_states(ids[None], positions[None], context)[0]
            return self.model.lm_head(hidden)

        return forward

    @torch.inference_mode()
    def _capture(self) -> CaptureReport:
        torch.cuda.synchronize()
        reserved = torch.cuda.memory_reserved()
        start = time.perf_counter()
        pool = None
        side = torch.cuda.Stream()
        # largest first: the smaller graphs reuse the largest one's memory (one shared pool)
        for size in sorted(self.buckets, reverse=True):
            forward = self.forwards[size] = self._forward(size)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # compiles the kernels and sizes the workspaces, off the capture
                forward()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[size] = forward()
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        return CaptureReport(self.buckets, time.perf_counter() - start, torch.cuda.memory_reserved() - reserved)

    def fits(self, batch: int) -> bool:
        return bucket_for(batch, self.buckets) is not None

    def run(self, step: DecodeStep) -> torch.Tensor:
        """Logits [batch, vocab] of a decode step, from the graph of its bucket."""
        batch = len(step.token_ids)
        size = bucket_for(batch, self.buckets)
        if size is None:
            raise ValueError(f"a decode step of {batch} sequences has no CUDA graph (largest {self.max_batch})")
        host = torch.tensor(step.padded(size, *self.backend.padding), dtype=torch.long)
        self.inputs[:, :size].copy_(host)  # the step's one host-to-device copy
        self.graphs[size].replay()
        return self.logits[size][:batch]
