#!/usr/bin/env python3
"""The summary of a CTest run (its --output-junit file): counts, and every test that did not pass,
by name. A skipped or disabled test that tests/expected_skips.txt does not list is an unexpected
skip and fails the run, as a failed test does.

  test_summary.py JUNIT_XML EXPECTED_SKIPS     exit 0 when nothing failed and no skip was unexpected
"""
import fnmatch
import sys
import xml.etree.ElementTree as ET


def load_expected(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, why = line.partition(" ")
            out.append((name, why.strip()))
    return out


def skip_reason(case):
    """The test's own words: gtest's message after "Skipped", a script's "SKIP: ..." line."""
    out = case.findtext("system-out") or ""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("SKIP: "):
            return line[6:]
        if line.endswith(": Skipped") and i + 1 < len(lines):
            return lines[i + 1]
    skipped = case.find("skipped")
    return skipped.get("message", "") if skipped is not None else out.strip()[:200]


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    junit, expected_path = sys.argv[1:]
    expected = load_expected(expected_path)
    cases = ET.parse(junit).getroot().iter("testcase")
    passed, failed, skipped, unexpected = 0, [], [], 0
    for case in cases:
        name, status = case.get("name"), case.get("status")
        if status == "run":
            passed += 1
        elif status == "fail":
            failed.append(name)
        else:  # "notrun" (skipped) or "disabled"
            why = "disabled" if status == "disabled" else skip_reason(case)
            match = next((r for g, r in expected if fnmatch.fnmatchcase(name, g)), None)
            if match is None:
                unexpected += 1
            skipped.append((name, why, match))
    total = passed + len(failed) + len(skipped)
    print(f"test summary: {total} tests, {passed} passed, {len(failed)} failed, "
          f"{len(skipped)} skipped ({len(skipped) - unexpected} expected, {unexpected} unexpected)")
    for name, why, match in skipped:
        tag = f"expected: {match}" if match is not None else "UNEXPECTED"
        print(f"  skipped: {name}: {why} [{tag}]")
    for name in failed:
        print(f"  failed:  {name}")
    if unexpected:
        print(f"{unexpected} unexpected skips: a skip that is not in {expected_path} fails the run "
              "(install what the test names, or run as CI does: root, KVASIR_REQUIRE_ASSETS=1)")
    return 1 if failed or unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
