//! Times `gearbox_analysis::analyze` on a small snippet and a 2000-line file per language and
//! prints a table of medians. Run by `bench/analysis_bench.sh` (release build).

use std::time::Instant;

/// A small snippet per language, each with a few findings.
fn small(language: &str) -> &'static str {
    match language {
        "python" => {
            "import os\nimport requests as r\nfrom subprocess import run\n\n\
             def main():\n    data = r.get('https://x.invalid').json()\n    run(['ls', '-l'])\n\
             \x20   with open('out.txt', 'w') as f:\n        f.write(str(data))\n\nmain()\n"
        }
        "javascript" => {
            "const { exec } = require('child_process');\nconst fs = require('fs');\n\n\
             async function main() {\n  const r = await fetch('https://x.invalid');\n\
             \x20 fs.writeFileSync('out.json', await r.text());\n  exec('ls -l', (e, o) => console.log(o));\n}\n\nmain();\n"
        }
        "go" => {
            "package main\n\nimport (\n\t\"fmt\"\n\t\"net/http\"\n\t\"os/exec\"\n)\n\n\
             func main() {\n\tresp, err := http.Get(\"https://x.invalid\")\n\tfmt.Println(resp, err)\n\
             \tout, _ := exec.Command(\"ls\", \"-l\").Output()\n\tfmt.Println(string(out))\n}\n"
        }
        _ => {
            "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l \"$f\"\ndone | sort -n\n\
             curl -fsSL https://x.invalid/data > data.json\njq '.items[]' data.json | head\n\
             pip install requests\necho done\n"
        }
    }
}

/// About 2000 lines of ordinary code in `language`, with a finding every block.
fn large(language: &str) -> String {
    let block = |i: usize| -> String {
        match language {
            "python" => format!(
                "def f{i}(items, limit={i}):\n    total = 0\n    for x in items:\n        if x > limit:\n\
                 \x20           total += x * {i}\n        else:\n            total -= len(str(x))\n\
                 \x20   result = {{'n': total, 'name': 'f{i}'}}\n    print(result)\n    return total\n\n"
            ),
            "javascript" => format!(
                "function f{i}(items, limit = {i}) {{\n  let total = 0;\n  for (const x of items) {{\n\
                 \x20   if (x > limit) total += x * {i};\n    else total -= String(x).length;\n  }}\n\
                 \x20 const result = {{ n: total, name: 'f{i}' }};\n  console.log(result);\n  return total;\n}}\n\n"
            ),
            "go" => format!(
                "func f{i}(items []int, limit int) int {{\n\ttotal := 0\n\tfor _, x := range items {{\n\
                 \t\tif x > limit {{\n\t\t\ttotal += x * {i}\n\t\t}} else {{\n\t\t\ttotal -= len(fmt.Sprint(x))\n\
                 \t\t}}\n\t}}\n\treturn total\n}}\n\n"
            ),
            _ => format!(
                "f{i}() {{\n  local total=0\n  for x in \"$@\"; do\n    if [ \"$x\" -gt {i} ]; then\n\
                 \x20     total=$((total + x * {i}))\n    else\n      total=$((total - ${{#x}}))\n    fi\n\
                 \x20 done\n  echo \"f{i} $total\" | tee -a log.txt\n}}\n\n"
            ),
        }
    };
    let mut out = match language {
        "python" => "import os\nimport socket\n\n".to_string(),
        "javascript" => "const net = require('net');\n\n".to_string(),
        "go" => "package main\n\nimport (\n\t\"fmt\"\n\t\"net/http\"\n)\n\n".to_string(),
        _ => "#!/bin/bash\ncurl -s https://x.invalid\n\n".to_string(),
    };
    let mut i = 0;
    while out.lines().count() < 2000 {
        out.push_str(&block(i));
        i += 1;
    }
    out
}

fn file_name(language: &str) -> &'static str {
    match language {
        "python" => "main.py",
        "javascript" => "main.js",
        "go" => "main.go",
        _ => "main.sh",
    }
}

/// Median wall time of `runs` analyses, in microseconds.
fn median_us(language: &str, src: &str, runs: usize) -> (f64, usize) {
    let files = [(file_name(language), src)];
    let mut findings = 0;
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let a = gearbox_analysis::analyze(language, &files);
            let us = t.elapsed().as_secs_f64() * 1e6;
            findings = a.findings.len();
            assert!(a.analysed && !a.parse_errors, "{language}: {}", a.summary());
            us
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], findings)
}

fn main() {
    println!("| language | input | lines | bytes | findings | median µs |");
    println!("|---|---|---:|---:|---:|---:|");
    for language in gearbox_analysis::LANGUAGES {
        let big = large(language);
        for (input, src, runs) in [
            ("small", small(language).to_string(), 501),
            ("2000 lines", big, 51),
        ] {
            let (us, findings) = median_us(language, &src, runs);
            println!(
                "| {language} | {input} | {} | {} | {findings} | {us:.0} |",
                src.lines().count(),
                src.len()
            );
        }
    }
}
