"""The OpenAPI document, built from the request models so it cannot drift from validation."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}


def answer(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {}}}


def path_id(what: str) -> dict[str, Any]:
    return {"name": "id", "in": "path", "required": True, "description": what, "schema": {"type": "string"}}


ERRORS = {
    "400": answer("body is not JSON"),
    "401": answer("bearer token missing or wrong (when auth is on)"),
    "422": answer("a field is invalid: `field` names it"),
    "503": answer("a store is down or nothing is published yet; retry after `Retry-After`"),
}
GET_ERRORS = {
    "401": ERRORS["401"],
    "404": answer("no record for this id in the published version: `id` names it"),
    "422": ERRORS["422"],
    "503": ERRORS["503"],
}
K_PARAMETER = {
    "name": "k",
    "in": "query",
    "required": False,
    "description": "at most this many items, best first (default: all that were stored)",
    "schema": {"type": "integer", "minimum": 1},
}


def openapi_document(
    search_request: type[BaseModel], labels_batch: type[BaseModel], recs_batch: type[BaseModel]
) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "precompute lookup", "version": "1"},
        "paths": {
            "/v1/search": {
                "post": {
                    "summary": "Embed the query and return the k nearest documents of the published version",
                    "requestBody": json_body(search_request),
                    "responses": {"200": answer("version and hits: id, score, payload"), **ERRORS},
                }
            },
            "/v1/labels/{id}": {
                "get": {
                    "summary": "The labels of one item, best first, from the published version",
                    "parameters": [path_id("item id")],
                    "responses": {"200": answer("version, id, labels: label, score"), **GET_ERRORS},
                }
            },
            "/v1/labels:batchGet": {
                "post": {
                    "summary": "The labels of many items, all from one published version",
                    "requestBody": json_body(labels_batch),
                    "responses": {
                        "200": answer("version, results: id, labels; missing: the ids not found"),
                        **ERRORS,
                    },
                }
            },
            "/v1/recs/{id}": {
                "get": {
                    "summary": "The recommended items of one user, best first, from the published version",
                    "parameters": [path_id("user id"), K_PARAMETER],
                    "responses": {"200": answer("version, id, items: id, score"), **GET_ERRORS},
                }
            },
            "/v1/recs:batchGet": {
                "post": {
                    "summary": "The recommended items of many users, all from one published version",
                    "requestBody": json_body(recs_batch),
                    "responses": {
                        "200": answer("version, results: id, items; missing: the ids not found"),
                        **ERRORS,
                    },
                }
            },
            "/healthz": {"get": {"summary": "The process is alive", "responses": {"200": answer("ok")}}},
            "/readyz": {
                "get": {
                    "summary": "Ready once the engine is warm and the stores answer",
                    "responses": {
                        "200": answer("the version served per output, null where none is published yet"),
                        "503": answer("not ready, with the reason"),
                    },
                }
            },
        },
    }
