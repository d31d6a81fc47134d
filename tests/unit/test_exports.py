"""The public surface of ``leasework`` is exactly what ``__init__`` exports (as Trio pins
its own): a name added or removed is a decision, made here."""

import leasework

PUBLIC = {
    "ApiError",
    "App",
    "AppError",
    "AppLoadError",
    "AsyncClient",
    "Client",
    "Enqueued",
    "FieldError",
    "IdempotencyConflict",
    "InvalidJob",
    "JobContext",
    "JobFailed",
    "JobType",
    "LeaseworkError",
    "Permanent",
    "Retry",
    "StaleFence",
    "FenceUnavailable",
    "Status",
    "Unique",
    "UniqueError",
    "UnknownJobType",
    "WaitTimeout",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "job",
}


def test_the_public_names_are_pinned():
    assert set(leasework.__all__) == PUBLIC


def test_every_public_name_exists_and_nothing_else_leaks():
    for name in leasework.__all__:
        assert getattr(leasework, name) is not None
    stray = {
        name
        for name in vars(leasework)
        if not name.startswith("_") and name not in PUBLIC and not _is_submodule(name)
    }
    assert stray == set()


def _is_submodule(name: str) -> bool:
    import types

    return isinstance(getattr(leasework, name), types.ModuleType)
