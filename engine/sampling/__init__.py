"""Sampling: the parameters a request decodes with, and turning a step's logits into tokens
over the whole batch in tensors (sampler, sampling batch, logits processors, inverse CDF).
"""
