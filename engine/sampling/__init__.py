"""Sampling: turning a step's logits into tokens over the whole batch in tensors (sampler,
sampling batch, logits processors, inverse CDF) and the structured-output grammars that mask
them. A request's parameters live a floor below, in engine/requests/.
"""
