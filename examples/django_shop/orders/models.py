from django.db import models


class Order(models.Model):
    email = models.EmailField()
    total_cents = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    receipt_sent_at = models.DateTimeField(null=True)
    receipt_fence = models.BigIntegerField(null=True)  # the attempt that recorded it
    receipts_recorded = models.PositiveIntegerField(default=0)  # how many times: once
