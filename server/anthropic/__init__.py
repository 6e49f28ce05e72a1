"""Anthropic's Messages API: POST /v1/messages and POST /v1/messages/count_tokens (router.py)."""
