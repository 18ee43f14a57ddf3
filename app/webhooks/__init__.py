"""Webhooks: SSRF-safe URLs, Standard Webhooks signing, delivery with retries."""
