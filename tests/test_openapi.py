"""The OpenAPI schema at /api/schema/ is complete and generates without a warning or an error."""

from __future__ import annotations

import re

import pytest
import yaml
from django.core.management import call_command
from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema

from mobile import selectors as mobile_selectors

KEY_OPERATIONS = {
    ("/api/devices/pairings", "post"): "devices_pairings_create",
    ("/api/devices/pairings/token", "post"): "devices_pairings_token_create",
    ("/api/devices/pairings/code/{user_code}/approve", "post"): "devices_pairings_code_approve_create",
    ("/api/devices", "get"): "devices_list",
    ("/api/devices/{device_id}", "get"): "devices_retrieve",
    ("/api/devices/bridge/pull", "post"): "devices_bridge_pull_create",
    ("/api/devices/bridge/push", "post"): "devices_bridge_push_create",
    ("/api/mobile/pending", "get"): "mobile_pending_retrieve",
    ("/api/mobile/answer", "post"): "mobile_answer_create",
    ("/api/mobile/state", "get"): "mobile_state_retrieve",
    ("/api/mobile/sessions/{session_id}/messages", "post"): "mobile_sessions_messages_create",
    ("/api/im/rooms", "get"): "im_rooms_list",
    ("/api/im/rooms/{room_id}", "get"): "im_rooms_retrieve",
    ("/api/im/rooms/{room_id}/messages", "get"): "im_rooms_messages_list",
    ("/api/im/rooms/{room_id}/messages", "post"): "im_rooms_messages_create",
    ("/api/im/rooms/{room_id}/panels/{panel_id}/actions", "post"): "im_rooms_panels_actions_create",
    ("/api/probes/", "get"): "probes_list",
    ("/api/probes/{probe}/commands", "post"): "probes_commands_create",
    ("/api/probes/commands/{command_id}/approve", "post"): "probes_commands_approve_create",
}


@pytest.fixture(scope="module")
def schema() -> dict:
    GENERATOR_STATS.reset()
    generated = SchemaGenerator().get_schema(request=None, public=True)
    problems = {"warnings": dict(GENERATOR_STATS._warn_cache), "errors": dict(GENERATOR_STATS._error_cache)}
    assert not GENERATOR_STATS, problems
    return generated


def test_schema_is_valid_openapi(schema):
    validate_schema(schema)


def test_the_command_ci_runs_passes(tmp_path):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    assert "/api/mobile/answer" in yaml.safe_load(out.read_text())["paths"]


def test_key_paths_have_stable_operation_ids(schema):
    found = {(path, method): op["operationId"] for path, ops in schema["paths"].items()
             for method, op in ops.items() if isinstance(op, dict) and "operationId" in op}
    assert {key: found.get(key) for key in KEY_OPERATIONS} == KEY_OPERATIONS
    assert len(set(found.values())) == len(found)


def _routes(patterns: list, prefix: str = "") -> list[str]:
    routes = []
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            routes += _routes(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            routes.append("/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route))
    return routes


def test_every_api_route_is_documented(schema):
    # Plain Django views under /api/ (the long poll) are skipped by the generator: document them too.
    api_routes = {r for r in _routes(get_resolver().url_patterns) if r.startswith("/api/")}
    assert api_routes - {"/api/schema/", "/api/docs/"} == set(schema["paths"])


def test_every_operation_is_tagged_by_app_and_declares_the_error_body(schema):
    for path, ops in schema["paths"].items():
        app = path.split("/")[2]
        for method, op in ops.items():
            assert op["tags"] == [app], (method, path)
            failures = {code: body for code, body in op["responses"].items() if code.startswith(("4", "5"))}
            assert failures, (method, path)
            for code, body in failures.items():
                assert body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}, \
                    (method, path, code)
    assert set(schema["components"]["schemas"]["Error"]["required"]) == {"error", "detail"}


def test_auth_is_declared(schema):
    paths = schema["paths"]
    for path in ("/api/devices/pairings", "/api/devices/pairings/token"):
        assert not paths[path]["post"].get("security"), path  # open: the device has no token yet
    for path in ("/api/devices/bridge/pull", "/api/devices/bridge/push"):
        assert paths[path]["post"]["security"] == [{"deviceToken": []}], path
    assert {"apiToken": []} in paths["/api/probes/{probe}/commands"]["post"]["security"]
    assert paths["/api/mobile/answer"]["post"]["security"] == [{"cookieAuth": []}]
    schemes = schema["components"]["securitySchemes"]
    assert schemes["deviceToken"]["scheme"] == schemes["apiToken"]["scheme"] == "bearer"


def _properties(schema: dict, name: str) -> set[str]:
    return set(schema["components"]["schemas"][name]["properties"])


@pytest.mark.django_db
def test_declared_bodies_match_what_the_views_render(schema, client, user):
    started = client.post("/api/devices/pairings", {"name": "laptop", "kind": "probe"}, content_type="application/json")
    assert started.status_code == 201
    assert set(started.json()) == _properties(schema, "PairingStarted")
    refused = client.post("/api/devices/pairings/token", {"device_code": "nope"}, content_type="application/json")
    assert refused.status_code == 400 and set(refused.json()) <= _properties(schema, "Error")
    state = mobile_selectors.mobile_state(user=user)
    assert set(state) == _properties(schema, "PhoneState")
    assert set(state["today"]) == _properties(schema, "Today")


@pytest.mark.django_db
def test_schema_and_docs_are_served(client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    assert "/api/probes/{probe}/commands" in response.json()["paths"]
    assert client.get("/api/docs/").status_code == 200
