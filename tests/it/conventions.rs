//! What users expect of a well-behaved server process: plain-text logs when stderr is
//! not a terminal (a file, a pipe, a log collector).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::support::TempFile;
use crate::support::{Cfg, PATIENCE};

#[test]
fn text_logs_have_no_colour_codes_when_stderr_is_not_a_terminal() {
    let config = TempFile::new("gateway.toml", &Cfg::new().toml("http://127.0.0.1:9"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_dedup-gateway"))
        .args(["--log-format", "text", "--config"])
        .arg(&config.0)
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let serving = line.contains("dedup-gateway serving");
            let _ = tx.send(line);
            if serving {
                return;
            }
        }
    });
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(PATIENCE) {
        let serving = line.contains("dedup-gateway serving");
        lines.push(line);
        if serving {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let text = lines.join("\n");
    assert!(text.contains("dedup-gateway serving"), "no start-up line:\n{text}");
    assert!(text.contains(" INFO "), "text format:\n{text}");
    assert!(!text.contains('\u{1b}'), "ANSI escape codes in a pipe:\n{text:?}");
}
