"""/openapi.json is built from the loaded app: each type's payload schema, by discriminator."""

from leasework.api.openapi import openapi_document
from leasework.demo import app


def test_each_job_type_has_a_submit_schema_with_its_payload():
    schemas = openapi_document(app)["components"]["schemas"]
    assert {r["$ref"].rsplit("/", 1)[1] for r in schemas["Submit"]["oneOf"]} == {
        f"Submit.{name}" for name in app.names
    }
    sleep = schemas["Submit.sleep"]
    assert sleep["properties"]["type"] == {"const": "sleep"}
    assert sleep["properties"]["payload"] == {"$ref": "#/components/schemas/Sleep"}
    assert schemas["Sleep"]["properties"]["seconds"]["maximum"] == 3600
    assert sleep["required"] == ["type"]  # every field of Sleep has a default
    assert "idempotency_key" in schemas["BatchItem.sleep"]["properties"]
    assert "idempotency_key" not in sleep["properties"]  # single submits use the header


def test_every_reference_resolves():
    document = openapi_document(app)
    schemas = document["components"]["schemas"]

    def refs(node):
        if isinstance(node, dict):
            if "$ref" in node:
                yield node["$ref"]
            for value in node.values():
                yield from refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value)

    for ref in refs(document):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas


def test_a_string_with_a_pattern_of_its_own_still_refuses_nul():
    """An email's ``[^@\\s]`` admits NUL, which the store refuses: the document must say so too,
    or a schema-valid request is answered 422 (schemathesis found this one)."""
    import re

    from leasework.api.openapi import NO_NUL, storable

    email = storable({"type": "string", "pattern": r"^[^@\s]+@[^@\s]+$"})
    patterns = [email["pattern"], *(part["pattern"] for part in email.get("allOf", []))]
    assert NO_NUL in patterns
    assert not all(re.search(p, "a\x00@b") for p in patterns)
    assert all(re.search(p, "a@b") for p in patterns)
    plain = storable({"type": "string"})
    assert plain["pattern"] == NO_NUL and "allOf" not in plain
    assert storable(email) == email  # applying it twice adds nothing
