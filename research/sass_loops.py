"""The loops of a cuobjdump -sass listing that hold tensor-core products (HGMMA), found by their backward branches,
each with its instruction count and opcode mix, or two builds' loop bodies diffed with addresses masked.

Why: to tell whether a change's cost sits in a kernel's key-tile loop or at its item ends without a GPU
(research/notes/attention.md, thirty-sixth session: the chained overlap's loop with and without O by TMA).
Run: python3 research/sass_loops.py A.sass [B.sass]          (loops of each listing)
     python3 research/sass_loops.py --diff A.sass LO HI B.sass LO HI   (two loop bodies, hex addresses)
"""
import collections
import difflib
import re
import sys


def parse(path):
    """(address, instruction) for each SASS line of the listing."""
    out = []
    for line in open(path):
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def loops(ins):
    """(start, end, instructions) of every backward branch's span that holds an HGMMA."""
    found = []
    for addr, text in ins:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            body = [x for a, x in ins if int(m.group(1), 16) <= a <= addr]
            if any("HGMMA" in x for x in body):
                found.append((int(m.group(1), 16), addr, body))
    return found


def opcode(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def main(argv):
    if argv[:1] == ["--diff"]:
        bodies = [[re.sub(r"0x[0-9a-f]+", "X", x) for a, x in parse(p) if int(lo, 16) <= a <= int(hi, 16)]
                  for p, lo, hi in (argv[1:4], argv[4:7])]
        diff = [d for d in difflib.unified_diff(*bodies, lineterm="", n=0) if not d.startswith("@@")]
        print(f"{len(bodies[0])} / {len(bodies[1])} instructions, {len(diff)} diff lines")
        print("\n".join(diff))
        return
    for path in argv:
        ins = parse(path)
        print(path, len(ins), "instructions")
        for lo, hi, body in loops(ins):
            mix = collections.Counter(opcode(x) for x in body).most_common(12)
            print(f"  {lo:#x}-{hi:#x}: {len(body)} instructions, " + ", ".join(f"{k} {v}" for k, v in mix))


if __name__ == "__main__":
    main(sys.argv[1:])
