"""Sampling: turning a step's logits into tokens over the whole batch in tensors, below the
runner boundary (issue 38): step_sampler (the step's device work, one read back), sampler,
sampling batch, logits processors (penalties, bias, filters), inverse CDF, beam candidates,
generators (generator_bank); step_io: the host data that crosses the boundary. A request's
parameters live in engine/requests/; this floor reads them through `sampling_batch.RowParams`.
The structured-output grammars that mask the logits are engine/grammar/.
"""
