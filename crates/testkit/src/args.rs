//! The examples' command-line options: `--name value` pairs, nothing more.

/// The value after `name` on the command line, parsed, or `default` when `name` is absent.
/// Panics with the option's name when the value does not parse.
pub fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}: cannot parse {v:?}"))
        })
        .unwrap_or(default)
}

/// Whether the flag `name` is on the command line.
pub fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}
