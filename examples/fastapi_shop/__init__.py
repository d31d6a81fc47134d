"""A FastAPI service on SQLAlchemy's asyncio engine (asyncpg) on leasework
(``examples.fastapi_shop``): ``POST /orders`` saves an order and enqueues its receipt job in
the request's transaction (``leasework.enqueue_async`` on the ``AsyncSession``); the job runs
in the asyncio lane on an asyncpg pool the lane opens, and records the receipt with the
fence confirmed in its own asyncpg transaction.

::

    export LEASEWORK_POSTGRES_DSN=postgresql://...   # a URL: asyncpg takes no key=value form
    leasework worker --app examples.fastapi_shop.jobs:app   # serves (and creates) fastapi-shop
    uvicorn examples.fastapi_shop.web:api
"""
