"""Prefill/decode disaggregation (issue 45): a `--role prefill` server computes prompts and sends
their K/V blocks to a `--role decode` server, whose RAM K/V tier (engine/kv_tiers) takes them
under the same chained keys, so its ordinary tier-hit path loads them instead of prefilling.

channel.py forms the two-rank gloo group and moves one `BlockBatch` (blocks.py) at a time;
sender.py sends on a background thread from a bounded queue (the transfer overlaps the next
prefill); receiver.py puts what arrives into the tier store and wakes whoever waits for it;
link.py is the engine's side of both roles (the export of a computed prefix, on the engine's
thread). Nothing is imported here: link.py is above the runner, the others below it.
"""
