"""Writes mixed_tasks.json: a small ShareGPT-format text dataset written for this project.

Every prompt and reply is composed here from templates, topics and code snippets of our own (no
corpus is copied), with a seeded ``random.Random``: the same seed writes the same bytes. The
tasks mix chat, code and editing; many editing and code tasks ask for answers that repeat most
of the prompt (fix the typos in a paragraph, add type hints, rename a variable, convert a list
to JSON), which is where n-gram (prompt lookup) drafting finds its matches.

    python scenarios/data/make_dataset.py                      # the committed file
    python scenarios/data/make_dataset.py --entries 10000 --out /tmp/big.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from task_texts import (  # beside this script (its folder is on sys.path when it runs)
    CITIES,
    DOCS,
    FIRST,
    FUNCTIONS,
    GREETINGS,
    ITEMS,
    QUESTIONS,
    SENTENCES,
    TOPICS,
)

HERE = Path(__file__).resolve().parent


def unhinted(fn: tuple) -> str:
    return fn[0].format(r="", **{f"a{i}": "" for i in range(len(fn[1]))})


def hinted(fn: tuple) -> str:
    return fn[0].format(r=fn[2], **{f"a{i}": a for i, a in enumerate(fn[1])})


def typo(word: str, rng: random.Random) -> str:
    i = rng.randrange(1, len(word) - 2)
    return word[:i] + word[i + 1] + word[i] + word[i + 2 :]


def fix_typos(rng: random.Random) -> tuple[str, str]:
    paragraph = " ".join(rng.sample(SENTENCES, rng.randint(3, 5)))
    words = paragraph.split(" ")
    candidates = [i for i, w in enumerate(words) if w.isalpha() and len(w) >= 6]
    fixes = []
    for i in sorted(rng.sample(candidates, min(len(candidates), rng.randint(2, 4)))):
        wrong = typo(words[i], rng)
        if wrong != words[i]:
            fixes.append((wrong, words[i]))
            words[i] = wrong
    ask = rng.choice(
        [
            "Fix the typos in this paragraph:",
            "Please correct the spelling mistakes in the following text:",
            "Proofread this and fix any typos:",
        ]
    )
    listed = "\n".join(f'- "{w}" -> "{r}"' for w, r in fixes)
    reply = f"Here is the corrected text:\n\n{paragraph}\n\nI fixed {len(fixes)} typos:\n{listed}"
    return f"{ask}\n\n{' '.join(words)}", reply


def add_type_hints(rng: random.Random) -> tuple[str, str]:
    fn = rng.choice(FUNCTIONS)
    ask = rng.choice(
        [
            "Add type hints to this function:",
            "Please annotate this Python function with type hints:",
        ]
    )
    reply = f"Here is the function with type hints:\n\n```python\n{hinted(fn)}```"
    if "Callable" in fn[1][0]:
        reply += "\n\nYou will also need `from typing import Callable, TypeVar` and "
        reply += "`T = TypeVar('T')`."
    return f"{ask}\n\n```python\n{unhinted(fn)}```", reply


def rename_variable(rng: random.Random) -> tuple[str, str]:
    fn = rng.choice(FUNCTIONS)
    old, new = fn[3], fn[4]
    code = hinted(fn) if rng.random() < 0.5 else unhinted(fn)
    renamed = re.sub(rf"\b{re.escape(old)}\b", new, code)
    ask = f"Rename the variable `{old}` to `{new}` in this code:"
    reply = (
        f"Sure, here is the code with `{old}` renamed to `{new}`:\n\n```python\n"
        f"{renamed}```\n\nNothing else changed."
    )
    return f"{ask}\n\n```python\n{code}```", reply


def add_docstring(rng: random.Random) -> tuple[str, str]:
    fn = rng.choice(FUNCTIONS)
    code = hinted(fn)
    name = code.split("(", 1)[0].removeprefix("def ")
    doc = f'    """{DOCS[name]}"""\n'
    head, body = code.split("\n", 1)
    reply = f"```python\n{head}\n{doc}{body}```"
    return f"Add a one-line docstring to this function:\n\n```python\n{code}```", reply


def explain_code(rng: random.Random) -> tuple[str, str]:
    fn = rng.choice(FUNCTIONS)
    code = unhinted(fn)
    lines = [line.strip() for line in code.splitlines()[1:] if line.strip()]
    steps = "\n".join(f"{i}. `{line}`" for i, line in enumerate(lines, 1))
    name = code.split("(", 1)[0].removeprefix("def ")
    reply = (
        f"The function `{name}` works line by line like this:\n\n{steps}\n\nIn short, it "
        f"returns its result once the loop or the checks are done."
    )
    return f"What does this function do?\n\n```python\n{code}```", reply


def people(rng: random.Random) -> list[tuple[str, int, str]]:
    names = rng.sample(FIRST, rng.randint(3, 6))
    return [(n, rng.randint(19, 70), rng.choice(CITIES)) for n in names]


def list_to_json(rng: random.Random) -> tuple[str, str]:
    rows = people(rng)
    listed = "\n".join(f"- name: {n}, age: {a}, city: {c}" for n, a, c in rows)
    data = [{"name": n, "age": a, "city": c} for n, a, c in rows]
    return (
        f"Convert this list to JSON:\n\n{listed}",
        f"```json\n{json.dumps(data, indent=2)}\n```",
    )


def csv_to_table(rng: random.Random) -> tuple[str, str]:
    rows = people(rng)
    csv = "name,age,city\n" + "\n".join(f"{n},{a},{c}" for n, a, c in rows)
    table = "| name | age | city |\n| --- | --- | --- |\n" + "\n".join(
        f"| {n} | {a} | {c} |" for n, a, c in rows
    )
    return f"Turn this CSV into a Markdown table:\n\n{csv}", table


def sort_list(rng: random.Random) -> tuple[str, str]:
    items = rng.sample(ITEMS, rng.randint(4, 8))
    listed = "\n".join(f"- {i}" for i in items)
    ordered = "\n".join(f"- {i}" for i in sorted(items))
    return f"Sort this shopping list alphabetically:\n\n{listed}", f"Sorted:\n\n{ordered}"


def formal_rewrite(rng: random.Random) -> tuple[str, str]:
    picked = rng.sample(SENTENCES, 2)
    casual = " ".join("so, " + s[0].lower() + s[1:].rstrip(".") + ", you know?" for s in picked)
    formal = " ".join(picked)
    reply = f"Here is a more formal version:\n\n{formal}\n\nI removed the filler words."
    return f"Rewrite this to sound more formal: {casual}", reply


def chat_topic(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(sorted(TOPICS))
    what, why, more = TOPICS[name]
    question = rng.choice(QUESTIONS).format(t=name)
    reply = (
        f"{name.capitalize()} is {what}. In practice, {why}. It is also worth knowing "
        f"that {more}. If you want, I can give an example of {name}."
    )
    return question, reply


def greeting(rng: random.Random) -> tuple[str, str]:
    return rng.choice(GREETINGS)


def write_test(rng: random.Random) -> tuple[str, str]:
    fn = rng.choice(FUNCTIONS[:3] + FUNCTIONS[6:7] + FUNCTIONS[8:9])
    code = hinted(fn)
    name = code.split("(", 1)[0].removeprefix("def ")
    reply = (
        f"```python\nimport pytest\n\n{code}\n\ndef test_{name}_on_a_simple_case():\n"
        f"    # check {name} against a value worked out by hand\n    ...\n```"
    )
    return f"Write a pytest test for this function:\n\n```python\n{code}```", reply


TASKS = [  # (task, weight)
    (fix_typos, 6),
    (add_type_hints, 5),
    (rename_variable, 5),
    (list_to_json, 4),
    (csv_to_table, 2),
    (sort_list, 2),
    (formal_rewrite, 2),
    (add_docstring, 3),
    (explain_code, 3),
    (write_test, 2),
    (chat_topic, 5),
    (greeting, 1),
]


def make(entries: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    tasks = [t for t, w in TASKS for _ in range(w)]
    out = []
    for i in range(entries):
        prompt, reply = rng.choice(tasks)(rng)
        out.append(
            {
                "id": f"mrv2-{i:05d}",
                "conversations": [
                    {"from": "human", "value": prompt},
                    {"from": "gpt", "value": reply},
                ],
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "mixed_tasks.json")
    args = parser.parse_args()
    data = make(args.entries, args.seed)
    text = "[\n" + ",\n".join(json.dumps(e, ensure_ascii=False) for e in data) + "\n]\n"
    args.out.write_text(text, encoding="utf-8")
    print(f"{args.out}: {len(data)} entries, {len(text.encode()):,} bytes")


if __name__ == "__main__":
    main()
