# leasework: `just up` brings the whole system up, `just test` runs every test.
# Both provision what they need (idempotently, cached). `just --list` shows every recipe.

set shell := ["bash", "-euo", "pipefail", "-c"]

python := justfile_directory() / ".venv/bin/python"
stack := python + " -m devstack"

# list the recipes
default:
    @just --list --unsorted

# create .venv and install leasework with its dev tools (skipped while pyproject.toml is unchanged)
bootstrap:
    #!/usr/bin/env bash
    set -euo pipefail
    stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
    if [ ! -f "$stamp" ]; then
        echo "bootstrap: creating .venv and installing leasework[dev]" >&2
        python3 -m venv .venv
        .venv/bin/pip install -q --upgrade pip
        .venv/bin/pip install -q -e ".[dev]"
        rm -f .venv/.installed-*
        touch "$stamp"
    fi

# provision and start everything: Postgres, Redis, Toxiproxy, 3 Kafka nodes, Alertmanager, Prometheus, then migrate, api, relay, workers; `just up --secure` runs leasework on the secured listeners only (TLS, SASL, ACL) until `just up --plain`
up *mode: bootstrap
    {{stack}} up {{mode}}

# start only the infrastructure (no leasework processes)
up-infra: bootstrap
    {{stack}} up-infra

# stop everything `just up` started (by recorded pid)
down: bootstrap
    {{stack}} down

# stop everything and delete the state directory (data and logs)
clean: bootstrap
    {{stack}} clean

# what runs where
status: bootstrap
    {{stack}} status

# tail one process's log, e.g. `just logs worker-1`
logs name lines="50": bootstrap
    {{stack}} logs {{name}} -n {{lines}}

# start, stop, kill, pause or resume one process, e.g. `just ctl stop relay`
ctl action name: bootstrap
    {{stack}} {{action}} {{name}}

# apply pending migrations (the stack must be up)
migrate: bootstrap
    {{python}} -m devstack migrate

# submit a noop job and wait until it has succeeded; fails with the last status seen
smoke: bootstrap
    {{python}} -m leasework smoke --timeout 60

# the leasework CLI against the local API, e.g. `just cli submit sleep '{"seconds": 2}'`
# (each argument passed as given: a cron expression's `*` is not a glob here)
[positional-arguments]
cli *args: bootstrap
    @{{python}} -m leasework "$@"

# unit tests only (no servers)
test-unit: bootstrap
    {{python}} -m pytest tests/unit -q

# every test: unit, then integration against the real stack (started if needed, reused if up), then API conformance, then the connection tests once more with the stack secured
test: test-plain test-secured

# unit, integration (the stack in its current mode, plain by default) and API conformance (8 examples per operation and phase here, to keep CI under 25 minutes; `just conformance` runs 50)
test-plain: bootstrap
    {{stack}} provision
    {{python}} -m pytest tests/unit -q
    {{stack}} up
    {{python}} -m pytest tests/integration -q --durations=15
    {{python}} -m tools.conformance --max-examples 8

# the long tests left out of `just test` (marked ondemand: what they show, a faster test shows too)
test-ondemand: bootstrap
    {{stack}} up
    {{python}} -m pytest tests -q -m ondemand

# the tests that touch a dependency's connection (the secured listeners, the leases, a whole job through every secured connection) with leasework's processes on the secured listeners (`up --secure`); the stack goes back to its mode before, pass or fail
test-secured: bootstrap
    #!/usr/bin/env bash
    set -euo pipefail
    before=$(cat "${LEASEWORK_STATE_DIR:-/var/tmp/leasework}/mode" 2>/dev/null || echo plain)
    trap '{{stack}} up --$before' EXIT
    {{stack}} up --secure
    {{python}} -m pytest -q tests/integration/test_secured.py tests/integration/test_lease.py

# schemathesis against /openapi.json, on an api and database of its own (see tools/conformance.py)
conformance: bootstrap
    {{stack}} up-infra
    {{python}} -m tools.conformance

# ruff lint and format check
lint: bootstrap
    {{python}} -m ruff check .
    {{python}} -m ruff format --check .

# ruff format and autofix
fmt: bootstrap
    {{python}} -m ruff format .
    {{python}} -m ruff check --fix .

# the floor, leasework by each door (direct links, then through Toxiproxy), pgbench; writes reports/bench/<time>/ (e.g. `just bench --jobs 5000`, `just bench --help`)
bench *args: bootstrap
    {{python}} -m tools.bench {{args}}

# a real duplicate under a plain TTL lease, and none under the fence (see docs/failure-modes.md)
demo-fence: bootstrap
    {{python}} -m tools.demo_fence

# run chaos scenarios against the live stack (all when no NAME), e.g. `just chaos b-worker-sigstop`
chaos *names: bootstrap
    {{stack}} up
    {{python}} -m chaos run {{names}}

# the soak: chaos load and a random fault every minute, sampling every process's RSS, fds and Postgres connections; reports/soak/<time>/ (e.g. `just soak --minutes 3`, `just soak --help`)
soak *args: bootstrap
    {{stack}} up
    {{python}} -m tools.soak {{args}}

# list the chaos scenarios
chaos-list: bootstrap
    {{python}} -m chaos list

# api, relay and worker in one process on your app, e.g. `just dev greetings:app` (Ctrl-C stops it); on 8080, where `just cli` looks: after `just up-infra`
dev app: bootstrap
    {{python}} -m leasework dev --app {{app}}

# how long /readyz and an honest submit take while attackers send every route its worst bodies; writes reports/bystander/<time>/ (`just bystander --help`)
bystander *args: bootstrap
    {{stack}} up
    {{python}} -m tools.bystander {{args}}

# the recovery of lost Kafka records at scale on the live stack: `just lost-records mass-loss` (100,000 jobs' records deleted with the workers stopped: time to recover, each once) or `just lost-records slow-drain` (a 200,000-job backlog drained for about ten minutes: nothing published again); reports/lost-records/<time>/
lost-records *args: bootstrap
    {{stack}} up
    {{python}} -m tools.lost_records {{args}}
