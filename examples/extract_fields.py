"""Structured extraction: one document prefilled once, 16 fork branches, each filling its own
small JSON schema (dates, names, amounts, yes/no answers). llguidance masks each branch's
logits to its schema, so every answer parses; jsonschema checks it anyway. (The 270M base
model gets many facts wrong and sometimes repeats a digit until n_predict cuts it, which
the branch reports as `truncated`: the shape is the constraint's, the content the model's.)
"""

from __future__ import annotations

import json

import jsonschema

import swarmkv as sk
from swarmkv.cli.demo_doc import DEMO_DOCUMENT, demo_prompt

YEAR = {"type": "integer", "minimum": 1800, "maximum": 2100}
NAME = {"type": "string", "minLength": 2, "maxLength": 40}
METRES = {"type": "number", "minimum": 0, "maximum": 20}
YES_NO = {"enum": ["yes", "no"]}
COUNT = {"type": "integer", "minimum": 0, "maximum": 100000}
# question -> the fields of its answer
FIELDS = {
    "When was the stone harbour built?": {"year": YEAR},
    "When was the harbour wall raised?": {"year": YEAR, "raised_by_metres": METRES},
    "When was the Mill Creek barrier completed, and what did it cost?": {
        "year": YEAR, "cost_million_pounds": COUNT},
    "Who founded the Wren Wardens, and when?": {"founder": NAME, "year": YEAR},
    "How many people live in Port Alder?": {"population": COUNT},
    "What was the highest tide on record?": {"metres": METRES, "year": YEAR},
    "How high did the tide peak on 14 February?": {"metres": METRES},
    "Did the harbour wall hold during the storm?": {"held": YES_NO},
    "How many fishing boats were damaged?": {"boats": COUNT},
    "How long is the grass embankment?": {"kilometres": METRES},
    "How many litres per second can the Quay Lane station move?": {"litres_per_second": COUNT},
    "What river runs through Port Alder?": {"river": NAME},
    "Did badgers damage the embankment?": {"badgers": YES_NO, "year_found": YEAR},
    "How many pumping stations are there?": {"stations": COUNT},
    "What time were the barrier gates closed?": {"time": {"type": "string",
                                                           "pattern": "^[0-9]{1,2}:[0-9]{2}$"}},
    "Was the Quay Lane generator enough for all pumps?": {"enough": YES_NO},
}  # fmt: skip


def schema_of(fields: dict) -> dict:
    return {"type": "object", "properties": fields, "required": list(fields),
            "additionalProperties": False}  # fmt: skip


with sk.Model(sk.default_model_path()) as model, sk.Pipeline(model, n_threads=2) as pipe:
    pipe.prefill("doc", text=DEMO_DOCUMENT)
    for i, (question, fields) in enumerate(FIELDS.items()):
        pipe.branch(f"q{i:02d}", prompt=demo_prompt(question) + " As JSON:", n_predict=48,
                    constraint=sk.Constraint.json_schema(schema_of(fields)))  # fmt: skip
    result = pipe.run("fork")
valid = 0
for (question, fields), b in zip(FIELDS.items(), result.branches.values(), strict=True):
    if b.stop_reason == "grammar":
        jsonschema.validate(json.loads(b.text), schema_of(fields))
        valid += 1
    print(f"{question}\n  -> {b.text}  [{b.stop_reason}, {b.forced_tokens} forced]")
forced = sum(b.forced_tokens for b in result.branches.values())
print(f"{result.prefix_tokens} document tokens prefilled once; {len(FIELDS)} branches")
print(f"{valid} of {len(FIELDS)} answers valid JSON under their schema; {forced} tokens forced")
