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
