"""What every benchmark script does with its result: print it, and write it as JSON when asked."""

import json
import os


def report_result(result: dict, output: str | None) -> None:
    print(json.dumps(result, indent=2))
    if output:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with open(output, "w") as f:
            json.dump(result, f, indent=2)
