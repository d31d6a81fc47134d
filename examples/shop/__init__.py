"""The example shop: an order endpoint that enqueues its receipt job in the same transaction,
the ``send_receipt`` job (``examples.shop.jobs:app``), and a small mail service that
deduplicates by idempotency key. ``python -m examples.shop`` serves the shop and the mail
service; the local stack (``just up``) runs it."""
