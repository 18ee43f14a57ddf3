"""Ten JSON schemas of the kinds programs ask a model for (nested objects, arrays,
enums, required fields, references), each with three documents to read, for the
tests and the benchmark of structured output."""

from __future__ import annotations

from typing import Any

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
SENTIMENT = {
    "type": "object",
    "properties": {
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "confidence": {"type": "number"},
    },
    "required": ["sentiment", "confidence"],
    "additionalProperties": False,
}
INVOICE = {
    "type": "object",
    "properties": {
        "vendor": {"type": "string"},
        "total": {"type": "number"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"item": {"type": "string"}, "price": {"type": "number"}},
                "required": ["item", "price"],
                "additionalProperties": False,
            },
            "maxItems": 5,
        },
    },
    "required": ["vendor", "total", "items"],
    "additionalProperties": False,
}
ADDRESS = {
    "type": "object",
    "properties": {
        "person": {"type": "string"},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
            "required": ["city", "country"],
            "additionalProperties": False,
        },
    },
    "required": ["person", "address"],
    "additionalProperties": False,
}
TAGS = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 4}
    },
    "required": ["tags"],
    "additionalProperties": False,
}
EVENT = {
    "type": "object",
    "properties": {
        "event": {"type": "string"},
        "year": {"type": "integer"},
        "certain": {"type": "boolean"},
    },
    "required": ["event", "year", "certain"],
    "additionalProperties": False,
}
TICKET = {
    "type": "object",
    "properties": {
        "priority": {"enum": ["low", "medium", "high"]},
        "team": {"enum": ["billing", "technical", "sales"]},
        "summary": {"type": "string", "maxLength": 80},
    },
    "required": ["priority", "team", "summary"],
    "additionalProperties": False,
}
REFERENCED = {
    "$defs": {
        "city": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
            "required": ["name", "population"],
            "additionalProperties": False,
        }
    },
    "type": "object",
    "properties": {"cities": {"type": "array", "items": {"$ref": "#/$defs/city"}, "maxItems": 3}},
    "required": ["cities"],
    "additionalProperties": False,
}
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": ["integer", "null"]}, "reasoning": {"type": "string"}},
    "required": ["reasoning", "answer"],
    "additionalProperties": False,
}
LIST_OF_NUMBERS = {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 6}

CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("person", PERSON, [
        "John Smith is 42 years old and lives in Leeds.",
        "Maria, aged 29, works as a nurse.",
        "The oldest member, Tom Baker, turned 87 this spring.",
    ]),
    ("sentiment", SENTIMENT, [
        "I love this phone, the battery lasts for days!",
        "The delivery was late and the box was broken.",
        "The package arrived on Tuesday.",
    ]),
    ("invoice", INVOICE, [
        "Invoice from Acme Ltd: 2 hammers at 10.50 each, one saw at 25. Total 46.",
        "Bob's Bakery billed us 12.40 for bread (8.40) and milk (4.00).",
        "Office Depot: paper 30, pens 5.5, total 35.5.",
    ]),
    ("address", ADDRESS, [
        "Alice moved to Paris, France last year.",
        "Kenji lives in Osaka, Japan.",
        "Send the parcel to Pedro in Lima, Peru.",
    ]),
    ("tags", TAGS, [
        "A recipe for a quick vegetable curry with rice.",
        "How to change a flat tyre on a bicycle.",
        "The history of the Roman empire in ten minutes.",
    ]),
    ("event", EVENT, [
        "The Berlin Wall fell in 1989.",
        "Man first walked on the Moon in 1969.",
        "Some say the city was founded around 750.",
    ]),
    ("ticket", TICKET, [
        "I was charged twice for my subscription this month, please refund.",
        "The app crashes every time I open the settings page.",
        "Could someone tell me about your enterprise pricing?",
    ]),
    ("referenced", REFERENCED, [
        "Tokyo has 14 million people and Osaka 2.7 million.",
        "London is home to about 9 million people.",
        "Rome (2.8 million), Milan (1.4 million) and Naples (0.9 million).",
    ]),
    ("answer", ANSWER, [
        "What is 12 plus 30?",
        "How many legs does a spider have?",
        "What is the colour of the sky?",
    ]),
    ("numbers", LIST_OF_NUMBERS, [
        "List the first few prime numbers.",
        "Give the years 2001, 2004 and 2010.",
        "Count from one to five.",
    ]),
]  # fmt: skip


def response_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def messages(document: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Extract the data from this text as JSON.\n\n{document}"}]
