"""Sampling: turning a step's logits into tokens over the whole batch in tensors, and the
structured-output grammars that mask them. Two floors share this room (tests/engine/
test_import_layers.py places each module): below the runner boundary, the step's device work
(step_sampler: sampler, sampling batch, logits processors, inverse CDF, token masks, beam
candidates, generators; step_io: the host data that crosses); above it, the grammars (compiled
and masked on the host, handed to the runner as host bitmasks). A request's parameters live in
engine/requests/; the floor reads them through `sampling_batch.RowParams`.
"""
