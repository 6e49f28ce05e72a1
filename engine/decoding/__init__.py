"""Decoding strategies and stopping: parallel samples (n > 1, best_of), beam search and its
stream, stop criteria and the incremental detokenizer.
"""
