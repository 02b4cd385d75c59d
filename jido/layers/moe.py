"""FusedMoE: a mixture-of-experts block (router, top-k, gated experts), split over ranks by experts or by width.

Without expert parallelism every rank holds every expert's slice of the intermediate width (a TP split like
the dense MLP's, all-reduced once). With it (``--enable-expert-parallel``) the TP group becomes the EP group:
rank ``r`` holds experts ``[r * E / P, (r + 1) * E / P)`` whole, and a layer runs as DeepEP-style dispatch and
combine: each rank routes its share of the (replicated) tokens, an all-to-all sends every (token, expert) pair
to the rank that holds the expert (after one small all-to-all of counts), the experts run, a second all-to-all
brings the results back, and the token shares are all-gathered. Weights stay dense in the model dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from jido.layers.activation import get_gated_activation
from jido.layers.parameter import copy_weight, empty_parameter
from jido.parallel.state import current


class FusedMoE(nn.Module):
    """``sum_k w_k * expert_k(x)`` over each token's top-k experts (Qwen3-MoE / Mixtral layout).

    Parameters: ``gate.weight`` ``[E, hidden]`` (the router, on every rank), ``w13_weight``
    ``[E_local, 2 * width, hidden]`` (gate rows then up rows) and ``w2_weight`` ``[E_local, hidden, width]``.
    Checkpoint tensors load per expert with shard ids ``"<expert>:gate_proj"``, ``":up_proj"``, ``":down_proj"``.
    ``expert_load`` counts the (token, expert) pairs routed to each EP rank since :meth:`take_expert_load`.
    """

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 norm_topk_prob: bool, hidden_act: str) -> None:
        super().__init__()
        parallel = current()
        self.ep, self.tp = parallel.ep, parallel.tp
        self.num_experts, self.top_k, self.norm_topk_prob = num_experts, top_k, norm_topk_prob
        if num_experts % self.ep.world_size:
            raise ValueError(f"num_experts ({num_experts}) is not divisible by the {self.ep.world_size} "
                             "expert-parallel ranks")
        self.num_local = num_experts // self.ep.world_size
        self.first_expert = self.ep.rank_in_group * self.num_local
        split_width = self.ep.world_size == 1 and self.tp.world_size > 1
        if split_width and intermediate_size % self.tp.world_size:
            raise ValueError(f"moe_intermediate_size ({intermediate_size}) is not divisible by "
                             f"tensor_parallel_size={self.tp.world_size}; try --enable-expert-parallel")
        self.width = intermediate_size // self.tp.world_size if split_width else intermediate_size
        self.width_start = self.tp.rank_in_group * self.width if split_width else 0
        self.intermediate_size = intermediate_size
        self.gate = nn.Module()
        self.gate.weight = empty_parameter(num_experts, hidden_size)
        self.w13_weight = empty_parameter(self.num_local, 2 * self.width, hidden_size, weight_loader=self.weight_loader)
        self.w2_weight = empty_parameter(self.num_local, hidden_size, self.width, weight_loader=self.weight_loader)
        self.act = get_gated_activation(hidden_act)
        self.expert_load = torch.zeros(self.ep.world_size, dtype=torch.long, device="cpu")

    def holds_expert(self, expert: int) -> bool:
        return self.first_expert <= expert < self.first_expert + self.num_local

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
        """Copy one expert's ``gate_proj`` / ``up_proj`` ``[I, hidden]`` or ``down_proj`` ``[hidden, I]`` (its
        width slice under a TP split) into its place."""
        expert, _, proj = (shard_id or "").partition(":")
        if not expert.isdigit() or proj not in ("gate_proj", "up_proj", "down_proj"):
            raise ValueError(f"an expert tensor needs a shard id '<expert>:gate_proj|up_proj|down_proj', got {shard_id!r}")
        local = int(expert) - self.first_expert
        if proj == "down_proj":
            expected = (param.shape[1], self.intermediate_size)
            part = loaded.narrow(1, self.width_start, self.width) if tuple(loaded.shape) == expected else loaded
            return copy_weight(param.data[local], part)
        rows = slice(0, self.width) if proj == "gate_proj" else slice(self.width, 2 * self.width)
        expected = (self.intermediate_size, param.shape[2])
        part = loaded.narrow(0, self.width_start, self.width) if tuple(loaded.shape) == expected else loaded
        copy_weight(param.data[local, rows], part)

    def take_expert_load(self) -> torch.Tensor:
        load, self.expert_load = self.expert_load, torch.zeros_like(self.expert_load)
        return load

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self._route(x)  # [N, k] each
        if self.ep.world_size > 1:
            return self._expert_parallel(x, weights, experts)
        out = self._run_experts(x, torch.arange(x.shape[0], device=x.device).repeat_interleave(self.top_k),
                                experts.flatten(), weights.flatten())
        return self.tp.all_reduce(out)

    def _route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(F.linear(x, self.gate.weight), dim=-1, dtype=torch.float)  # [N, E]
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        owners = experts.flatten() // self.num_local
        self.expert_load += torch.bincount(owners, minlength=self.ep.world_size).cpu()
        return weights.to(x.dtype), experts

    def _run_experts(self, x: torch.Tensor, token_ids: torch.Tensor, expert_ids: torch.Tensor,
                     weights: torch.Tensor) -> torch.Tensor:
        """``out[t] += w * expert(x[t])`` for each (token, expert, weight) triple whose expert is held here."""
        out = torch.zeros_like(x)
        for local in torch.unique(expert_ids - self.first_expert).tolist():
            if not 0 <= local < self.num_local:
                continue
            pick = torch.nonzero(expert_ids == local + self.first_expert).squeeze(1)
            tokens = token_ids[pick]
            hidden = self.act(F.linear(x[tokens], self.w13_weight[local]))
            out.index_add_(0, tokens, F.linear(hidden, self.w2_weight[local]) * weights[pick, None])
        return out

    def _expert_parallel(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """Dispatch this rank's share of the tokens to the experts' ranks by all-to-all, combine, all-gather."""
        ep, num_tokens = self.ep, x.shape[0]
        shares = [num_tokens // ep.world_size + (r < num_tokens % ep.world_size) for r in range(ep.world_size)]
        start = sum(shares[:ep.rank_in_group])
        mine = slice(start, start + shares[ep.rank_in_group])
        expert_ids = experts[mine].flatten()  # [n * k] pairs of this rank's tokens
        order = torch.argsort(expert_ids, stable=True)  # grouped by expert, hence by the rank that holds it
        token_ids = torch.arange(start, mine.stop, device=x.device).repeat_interleave(self.top_k)[order]
        expert_ids = expert_ids[order]
        per_expert = torch.bincount(expert_ids, minlength=self.num_experts)
        # [P, E_local]: how many rows this rank sends each rank for each of its experts, and receives back.
        recv_per_expert = ep.all_to_all(per_expert.view(ep.world_size, self.num_local),
                                        [1] * ep.world_size, [1] * ep.world_size)
        send_rows, recv_rows = per_expert.view(ep.world_size, -1).sum(1).tolist(), recv_per_expert.sum(1).tolist()
        received = ep.all_to_all(x[token_ids], send_rows, recv_rows)
        # Rows arrive by sender, each sender's grouped by expert: the expert of every row follows from the counts.
        local_experts = torch.arange(self.num_local, device=x.device).repeat(ep.world_size)
        row_experts = local_experts.repeat_interleave(recv_per_expert.flatten()) + self.first_expert
        rows = torch.arange(received.shape[0], device=x.device)
        computed = self._run_experts(received, rows, row_experts, torch.ones_like(row_experts, dtype=x.dtype))
        returned = ep.all_to_all(computed, recv_rows, send_rows)
        out = torch.zeros_like(x)
        out.index_add_(0, token_ids, returned * weights[mine].flatten()[order, None])
        return ep.all_gather_rows(out[mine], shares)
