"""A Django project on leasework (``examples.django_shop``): a view saves an order and
enqueues its receipt task in one ``transaction.atomic()``; the task, plain sync Django code,
records the receipt through the ORM inside ``fenced_atomic``, so a stale attempt's write is
refused. Its tasks wait in the leasework queue ``django-shop``.

::

    export LEASEWORK_POSTGRES_DSN=postgresql://...
    export DJANGO_SETTINGS_MODULE=examples.django_shop.settings
    django-admin migrate            # the orders table, and leasework's schema
    LEASEWORK_QUEUES=django-shop leasework worker --app leasework.django:app  # makes the queue
    django-admin runserver          # POST /orders {"email": ..., "total_cents": ...}
"""
