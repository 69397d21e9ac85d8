"""The YAML loader of workload files (and price tables): strict where PyYAML is lenient.

Its own module so that `workloads.catalog` imports PyYAML only when it reads a YAML file: a run
replaying a trace file needs none, and the import costs ~0.04 s of the start-up (issue 10).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

# libyaml's scanner where PyYAML has it (linear, and refuses nesting past 1000 levels); the pure
# Python one is quadratic in flow nesting depth (seconds for a hostile `[[[[...`).
_SafeBase = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictLoader(_SafeBase):
    """YAML 1.1's safe loader, but `1e3` and `2.5e-3` are numbers (as in YAML 1.2, JSON and the CSV
    trace reader), not strings: PyYAML's float pattern requires a dot and a signed exponent. A key
    given twice is an error (YAML 1.2 requires unique keys; PyYAML silently keeps the last); a key
    beside a `<<` merge overrides the merged one, as YAML's merge key means."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: keys given beside it win
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str):
                    continue
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)
