#!/bin/sh
# json_names.sh PLAN WORK: tokpipe-plan --json stays valid JSON whatever the names hold: a
# hardware profile named with a quote, a backslash and UTF-8 (kept as it is).
plan=$1 work=$2 src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 2
sed "s/\"name\": \"cpu\"/\"name\": \"a\\\\\"b\\\\\\\\c mod\xc3\xa8le\"/" "$src/tools/profiles/cpu.json" > hw.json
"$plan" --model layers=2,hidden=64,heads=2,seq=32,vocab=100 --hardware hw.json --slices 2 --json > out.json || exit 1
/usr/bin/python3 -c '
import json, sys
d = json.load(open("out.json"))
want = "a\"b\\c mod\u00e8le"
if "mod\u00e8le".encode() not in open("out.json", "rb").read(): sys.exit("the UTF-8 name is not written as it is")
sys.exit(0 if d["hardware"] == want else "hardware %r, want %r" % (d["hardware"], want))' && echo "ok: valid JSON, hardware name kept"
