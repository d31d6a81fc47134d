"""Each rule every door enforces is written once (leasework/job.py, leasework/states.py) and the
SQL door's copy in the migrations is tested equal to it."""

import pathlib
import re

from leasework import states
from leasework.job import (
    MAX_ATTEMPTS,
    MAX_DELAY_SECONDS,
    MAX_KEY_CHARS,
    MAX_TIMEOUT_SECONDS,
    TYPE_NAME_REGEX,
)
from leasework.states import Status

ROOT = pathlib.Path(__file__).resolve().parents[2]
MIGRATIONS = sorted((ROOT / "leasework" / "migrations").glob("*.sql"))


def enqueue_function() -> str:
    """The body of the newest definition of the SQL door's ``leasework_enqueue``."""
    bodies = []
    for path in MIGRATIONS:
        text = path.read_text()
        for match in re.finditer(
            r"CREATE (?:OR REPLACE )?FUNCTION leasework_enqueue\(.*?\$\$(.*?)\$\$", text, re.S
        ):
            bodies.append(match.group(1))
    assert bodies, "no migration defines leasework_enqueue"
    return bodies[-1]


def test_the_sql_door_checks_the_same_type_name_as_python():
    sql = enqueue_function()
    assert re.search(r"job_type !~ '([^']+)'", sql).group(1) == TYPE_NAME_REGEX


def test_the_sql_door_checks_the_same_limits_as_python():
    sql = enqueue_function()

    def upper(pattern: str) -> int:
        return int(re.search(pattern, sql).group(1))

    assert upper(r"max_attempts BETWEEN 1 AND (\d+)") == MAX_ATTEMPTS
    assert upper(r"timeout_seconds BETWEEN 1 AND (\d+)") == MAX_TIMEOUT_SECONDS
    assert upper(r"delay > interval '(\d+) days'") * 86_400 == MAX_DELAY_SECONDS
    assert upper(r"length\(ordering_key\) BETWEEN 1 AND (\d+)") == MAX_KEY_CHARS
    assert upper(r"length\(idempotency_key\) BETWEEN 1 AND (\d+)") == MAX_KEY_CHARS


def test_no_other_product_module_spells_the_type_name_rule_out():
    spelled = "A-Za-z0-9_.:-]{1,100}"
    holders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "leasework").rglob("*.py")
        if spelled in path.read_text() and path.name != "job.py"
    ]
    assert holders == []


def test_terminal_states_are_those_nothing_leaves():
    assert states.TERMINAL == {Status.SUCCEEDED, Status.DEAD, Status.CANCELLED}


def test_no_product_module_lists_the_terminal_states_by_hand():
    literal = re.compile(
        r"""['"](succeeded|dead|cancelled)['"]\s*,\s*['"](succeeded|dead|cancelled)['"]"""
    )
    holders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in (ROOT / "leasework").rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if literal.search(line)
    ]
    assert holders == []
