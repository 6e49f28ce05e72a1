"""The runner floor's random generators: one per seeded sequence, and the shared ones.

Contract: `GeneratorBank(device, seed)`. `of(key)` is the generator of a seeded sequence
(`SeedKey`: request id, sequence id, seed), made once by `seeded_generator(seed, seq_id)` and
kept across steps and preemptions until `release(request_ids)` (the engine names the requests
that ended with the next step's inputs); `None` for an unseeded row (the sampler's own generator serves those). `beams` is what
unseeded beam-sampling groups draw from, seeded with `seed` (the engine's). `states(keys)` / `restore(states)` put
generators back where they were (a raising batched draw is redone row by row).
`rewind(key, state, num_draws)`: a speculated sequence's generator, from its state before the
step, advanced by the draws of the tokens it kept (speculative/acceptance.py's `rewind_draws`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from engine.sampling.sampler import seeded_generator
from engine.sampling.step_io import SeedKey
from engine.speculative.acceptance import rewind_draws


class GeneratorBank:
    def __init__(self, device: torch.device, seed: int | None) -> None:
        self.device = device
        self.beams = torch.Generator(device=device)
        if seed is None:
            self.beams.seed()
        else:
            self.beams.manual_seed(seed)
        self._seeded: dict[tuple[str, int], torch.Generator] = {}

    def of(self, key: SeedKey | None) -> torch.Generator | None:
        if key is None:
            return None
        generator = self._seeded.get((key.request_id, key.seq_id))
        if generator is None:
            generator = seeded_generator(key.seed, key.seq_id, self.device)
            self._seeded[(key.request_id, key.seq_id)] = generator
        return generator

    def release(self, request_ids: Iterable[str]) -> None:
        gone = set(request_ids)
        if gone:
            for k in [k for k in self._seeded if k[0] in gone]:
                del self._seeded[k]

    def states(self, keys: Iterable[SeedKey | None]) -> list[tuple[torch.Generator, torch.Tensor]]:
        found = {id(g): g for g in (self.of(k) for k in keys) if g is not None}
        return [(g, g.get_state()) for g in found.values()]

    @staticmethod
    def restore(states: Iterable[tuple[torch.Generator, torch.Tensor]]) -> None:
        for generator, state in states:
            generator.set_state(state)

    def rewind(self, key: SeedKey, state: torch.Tensor, num_draws: int) -> None:
        generator = self.of(key)
        rewind_draws(generator, state, num_draws, generator.device)

    def __len__(self) -> int:
        return len(self._seeded)
