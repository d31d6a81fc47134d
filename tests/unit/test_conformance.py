from tools.conformance import database_dsn, summary


def test_database_dsn_replaces_only_the_name():
    assert database_dsn("postgresql://u:p@h:1/leasework", "x") == "postgresql://u:p@h:1/x"


def test_summary_keeps_failures_and_the_verdict():
    out = (
        "noise\n  ❌ ST202 Schema-valid request rejected: 2\n"
        "  9 generated, 2 found\n==== 2 failures ====\n"
    )
    assert summary(out) == [
        "  ❌ ST202 Schema-valid request rejected: 2",
        "  9 generated, 2 found",
        "==== 2 failures ====",
    ]
