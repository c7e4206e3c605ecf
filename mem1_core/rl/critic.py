"""The value model: the policy's architecture with its own weights and a scalar head.

`Critic.forward` runs its transformer once over the same flattened tree as the policy
(same boolean / BlockMask mask, same depth positions) and gives every token the value of
the state *before* it: the hidden state is read at `prev_index`, the token before it in
its own context, exactly where the policy reads the logits that sampled it. So for a
generated token the value is V(context so far), the quantity GAE needs, and for the first
generated token of turn t it is the value of turn t's real context (the carried `<IS>`,
`<query>` and `<info>`), not of the flat neighbour in the tree.

Initialisation follows common PPO practice for LLMs (verl, OpenRLHF): the transformer is a
copy of the initial policy's; the head starts at zero, so the first values are 0.

Saved as `save_pretrained` of the transformer (safetensors) plus `value_head.safetensors`.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import AutoModel, PreTrainedModel

from mem1_core.models.model import DTYPES
from mem1_core.trajectory.logprobs import Attn, tree_hidden
from mem1_core.trajectory.tree import FlatBatch

VALUE_HEAD_FILE = "value_head.safetensors"


class Critic(nn.Module):
    """A base transformer (no LM head) and a linear value head in float32."""

    def __init__(self, backbone: PreTrainedModel):
        super().__init__()
        self.backbone = backbone
        # float32 head: values are regression targets of order 1; bf16 would round them.
        self.value_head = nn.Linear(backbone.config.hidden_size, 1, dtype=torch.float32)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_policy(cls, policy: PreTrainedModel, layers: int | None = None) -> Critic:
        """A critic whose transformer is a copy of the policy's (its own weights); with
        `layers`, of only its first `layers` decoder layers (`ppo.critic_layers`): a cheaper
        baseline, read from the trunk's middle where the policy reads its last layer."""
        decoder = policy.get_decoder()
        if layers is None:
            return cls(copy.deepcopy(decoder))
        total = len(decoder.layers)
        if not 1 <= layers <= total:
            raise ValueError(
                f"ppo.critic_layers={layers}: the policy has {total} decoder layers; use 1 to "
                f"{total}, or null for all"
            )
        every = decoder.layers
        decoder.layers = nn.ModuleList()  # copy the rest, then only the layers kept
        try:
            backbone = copy.deepcopy(decoder)
        finally:
            decoder.layers = every
        backbone.layers = copy.deepcopy(every[:layers])
        backbone.config.num_hidden_layers = layers
        if getattr(backbone.config, "layer_types", None) is not None:
            backbone.config.layer_types = list(backbone.config.layer_types[:layers])
        return cls(backbone)

    def forward(
        self, batch: FlatBatch, attn: Attn | str | None = None, *, mask: object | None = None
    ) -> Tensor:
        """Values over a flattened tree. batch: (B, L) -> (B, L) float32: the value of the
        context before each token (read at prev_index); 0 where a token has none."""
        # The same forward as the policy's (mem1_core.trajectory.logprobs.tree_hidden): the shared
        # prefix under sdpa/eager, one pass with a BlockMask under flex or a given mask.
        hidden = tree_hidden(self.backbone, batch, attn, mask=mask)
        index = batch.prev_index.clamp(min=0)[..., None].expand(-1, -1, hidden.shape[-1])
        # The head in float32 even under bf16 autocast (model.autocast): values are regression
        # targets of a few-hundredths' precision, which bf16's 8-bit mantissa would round away.
        with torch.autocast(hidden.device.type, enabled=False):
            values = self.value_head(hidden.gather(1, index).float()).squeeze(-1)
        return torch.where(batch.prev_index >= 0, values, torch.zeros_like(values))

    def save(self, out_dir: str | Path) -> Path:
        """Write the transformer (save_pretrained, safetensors) and the head into `out_dir`."""
        out = Path(out_dir)
        self.backbone.save_pretrained(out, safe_serialization=True)
        head = {k: v.detach().cpu().contiguous() for k, v in self.value_head.state_dict().items()}
        save_file(head, str(out / VALUE_HEAD_FILE))
        return out

    @classmethod
    def load(cls, path: str | Path, dtype: str = "float32", attn: str = "sdpa") -> Critic:
        """Read a critic written by `save`."""
        path = Path(path)
        if not (path / VALUE_HEAD_FILE).is_file():
            raise FileNotFoundError(f"{path} is not a critic directory (no {VALUE_HEAD_FILE})")
        backbone = AutoModel.from_pretrained(
            str(path), dtype=DTYPES[dtype], attn_implementation=attn, use_safetensors=True
        )
        critic = cls(backbone.eval())
        critic.value_head.load_state_dict(load_file(str(path / VALUE_HEAD_FILE)))
        return critic.eval()


def check_critic_layers(critic: Critic, layers: int | None, where: Path) -> None:
    """A saved critic continues only as the run asks for it (`ppo.critic_layers`)."""
    have = len(critic.backbone.layers)
    if layers is not None and have != layers:
        raise ValueError(
            f"{where} holds a critic of {have} layers but ppo.critic_layers={layers}: set "
            f"ppo.critic_layers={have}, or start the critic afresh from a policy without one"
        )
