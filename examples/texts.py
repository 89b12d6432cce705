"""Write a small labeled text corpus in the layout `privpipe federated` reads, for the federated tutorial
(docs/tutorials/federated.md):

    .venv/bin/python examples/texts.py                                   # writes data/raw/texts.jsonl (2,000 lines)
    .venv/bin/privpipe federated --params examples/params-texts.yaml     # DP-FedAvg over its 50 users

One JSON object a line: ``{"text": ..., "label": ..., "split": "train"|"test", "user": "user-007"}``: short
messages on four topics from 50 users, made from templates with a seeded generator (synthetic: nothing is
downloaded, and no person wrote them). Your own file needs only the text and label keys (text.text_column,
text.label_column); a split key is optional, and a client key (text.client_column, here ``user``) makes each of
its values one federated client.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

__all__ = ["TOPICS", "write_texts"]

TOPICS: dict[str, tuple[list[str], list[str]]] = {  # label: (sentence templates, words for their {} slot)
    "weather": (["Heavy {} expected tomorrow morning.", "The forecast says {} all weekend.",
                 "Bring a coat, there is {} on the way.", "Another day of {} in the valley."],
                ["rain", "snow", "fog", "sunshine", "wind", "hail", "thunderstorms", "drizzle"]),
    "sport": (["Great {} match last night.", "Our team lost the {} final again.",
               "Training for the {} season starts Monday.", "Who won the {} game?"],
              ["football", "tennis", "basketball", "hockey", "cricket", "rugby", "volleyball", "golf"]),
    "cooking": (["Try adding {} to the sauce.", "My {} soup recipe is finally perfect.",
                 "Roast the {} for forty minutes.", "Is fresh {} better than dried?"],
                ["garlic", "basil", "onion", "tomato", "ginger", "pepper", "mushroom", "thyme"]),
    "travel": (["Our flight to {} was delayed.", "Booked a week in {} for the spring.",
                "The train through {} is beautiful.", "Any hotel tips for {}?"],
               ["Lisbon", "Kyoto", "Oslo", "Lima", "Nairobi", "Vienna", "Hanoi", "Quebec"]),
}


def write_texts(path: Path, *, records: int = 2000, users: int = 50, test_fraction: float = 0.2,
                seed: int = 0) -> int:
    """``records`` lines at ``path``: topics in turn, each run of four lines (one per topic) from one user, the
    last ``test_fraction`` of them the test split."""
    rng = random.Random(seed)
    labels = sorted(TOPICS)
    n_test = round(records * test_fraction)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for i in range(records):
            label = labels[i % len(labels)]
            templates, words = TOPICS[label]
            text = rng.choice(templates).format(rng.choice(words))
            split = "test" if i >= records - n_test else "train"
            user = f"user-{(i // len(labels)) % users:03d}"
            out.write(json.dumps({"text": text, "label": label, "split": split, "user": user}) + "\n")
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data/raw/texts.jsonl"), help="where to write the corpus")
    parser.add_argument("--records", type=int, default=2000, help="how many lines")
    args = parser.parse_args()
    print(f"{args.out}: {write_texts(args.out, records=args.records)} texts on {len(TOPICS)} topics")


if __name__ == "__main__":
    main()
