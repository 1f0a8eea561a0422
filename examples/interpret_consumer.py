"""A consumer of readings, run over ``capseal interpret --json`` output.

    capseal interpret LEDGER --json > readings.json
    python examples/interpret_consumer.py readings.json      # or: ... | python examples/interpret_consumer.py -

Everything from ``import json`` to ``describe`` is agent-judge's published
consumer example for its interpretations, unchanged: it reads the interpretation's fields only and never
traverses the stored record. Only the file loading at the end is this file's
own: it reads the items of the output, describes each, and prints the tally
and the pass rate.
"""

import json
from collections import Counter

# --- Experiment's policy. Every line here is Experiment's, and none of it is in the file. ---
BUCKET = {"ACCEPTED": "passes", "REJECTED": "nonPasses", "UNDECIDED": "nonPasses",
          "NOT_APPLICABLE": "excluded", "NOT_ASSESSED": "instrumentFailures"}
COUNT_UNVERIFIED = True   # an UNDETERMINED reading is counted by its reading, and reported as unverified

def tally(items):
    t = Counter()
    for item in items:
        i = item["interpretation"]
        if i["readingSupport"] == "CONTRADICTED":
            t["unattestable"] += 1                 # reported, never counted
            continue
        if i["readingSupport"] == "UNDETERMINED":
            t["unverified"] += 1                   # always reported
            if not COUNT_UNVERIFIED:
                continue
        t[BUCKET[i["reading"]]] += 1
    return t

def pass_rate(t):
    judged = t["passes"] + t["nonPasses"]
    return t["passes"] / judged if judged else None   # absent, never 0

# --- Reading the explanation: fields only, no traversal of the stored verdict. ---
def describe(item):
    i = item["interpretation"]
    d = i["decidedBy"]
    print(f"{item['itemSlug']}: {i['reading']} ({i['readingSupport']}); "
          f"decided by {d['stage'] if d else 'not recorded'}")
    for s in [i["root"], *i["stages"]]:
        where = "/".join(s["path"]) or "<root>"
        print(f"  {where} [{s['policy'] or '-'}] {s['status']}"
              + (f" {s['reasonCode']}" if s["reasonCode"] else "") + f": {s['reasoning']}")
        for j in s["judges"]:
            print(f"    seat {j['position']} {j['name']}: {j['status']}"
                  + (f" ({j['reasonCode']})" if j["reasonCode"] else "") + f" — {j['reasoning']}")
            for c in j["checks"]:
                print(f"      [{'x' if c['passed'] else ' '}] {c['name']}: {c['detail']}")
    for x in i["defects"]:
        print(f"  ! {x['kind']} {x['path']}.{x['field']}: {x['note']}")
    print(f"  {i['summary']}")


# --- File loading (this file's own): the items of `capseal interpret --json` output. ---
if __name__ == "__main__":
    import sys

    with (sys.stdin if sys.argv[1:] in ([], ["-"]) else open(sys.argv[1], encoding="utf-8")) as source:
        items = json.load(source)["items"]
    for item in items:
        describe(item)
    t = tally(items)
    print(f"tally: {dict(sorted(t.items()))}")
    print(f"pass rate: {pass_rate(t)}")
