//! Where settings come from: the command line, then the environment, then
//! the TOML file, then the built-in defaults.
//!
//! clap parses and types every value. The file's values and the
//! environment's are handed to it as flags placed before the command line's
//! own (a later flag wins), so that there is one parser, one set of types
//! and one error path; clap's own reading of the environment is turned off
//! for the parse (the environment is whatever `env` says, which lets tests
//! pass their own) and kept for `--help`, which shows each variable.
//!
//! A setting is named once, by its id `section.key` (its key in the file)
//! and its flag; its variable is the flag's name, upper-cased, after
//! `HARNESS_` (`--max-steps`: `HARNESS_MAX_STEPS`), unless it names a
//! variable of its own (`DATABASE_URL`, `OPENAI_API_KEY`, the
//! OpenTelemetry ones).

use std::ffi::OsString;

use clap::{
    ArgMatches, Command,
    error::{ContextKind, ContextValue, ErrorKind},
};

/// A setting that could not be used, named as the operator wrote it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    ReadFile {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {source}")]
    ParseFile {
        path: String,
        source: Box<toml::de::Error>,
    },
    #[error("config file {path}: {key}: {reason}")]
    FileKey {
        path: String,
        key: String,
        reason: String,
    },
    #[error("{name}: {reason}")]
    Invalid { name: String, reason: String },
    /// Help, the version, or a command line clap refuses: clap prints it.
    #[error("{0}")]
    Cli(clap::Error),
}

/// One flag of the command that has an environment variable.
struct Flag {
    id: String,
    long: String,
    env: String,
}

/// Where the value a flag gets came from.
#[derive(Clone)]
enum Origin {
    CommandLine,
    Environment(String),
    File { path: String, key: String },
}

/// Parses `args` (the first is the program's name) with `command`, the
/// values of `env` and of the file named by `--config` or `HARNESS_CONFIG`.
#[expect(
    clippy::too_many_lines,
    reason = "the layers of configuration, applied in their order"
)]
pub fn load_matches<I, T>(
    command: Command,
    args: I,
    env: impl Fn(&str) -> Option<String>,
) -> Result<ArgMatches, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let command = with_variables(command);
    let flags: Vec<Flag> = command
        .get_arguments()
        .filter_map(|arg| {
            Some(Flag {
                id: arg.get_id().as_str().to_owned(),
                long: arg.get_long()?.to_owned(),
                env: arg.get_env()?.to_str()?.to_owned(),
            })
        })
        .collect();
    let given = |flag: &Flag| {
        let exact = format!("--{}", flag.long);
        let with_value = format!("{exact}=");
        args.iter().skip(1).take_while(|a| *a != "--").any(|a| {
            a.to_str()
                .is_some_and(|a| a == exact || a.starts_with(&with_value))
        })
    };
    let value_of = |name: &str| {
        env(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };

    // Lowest first: the file, then the environment; the command line wins.
    let mut found: Vec<(usize, String, Origin)> = Vec::new();
    let config = config_path(&args).or_else(|| value_of("HARNESS_CONFIG"));
    if let Some(path) = &config {
        // A setting's id is `section.key`: the sections are those prefixes.
        let mut sections: Vec<&str> = flags
            .iter()
            .filter_map(|f| f.id.split_once('.').map(|(section, _)| section))
            .collect();
        sections.dedup();
        for (key, value) in read_file(path, &sections)? {
            let Some(index) = flags.iter().position(|f| f.id == key) else {
                return Err(ConfigError::FileKey {
                    path: path.clone(),
                    key,
                    reason: "no such setting".to_owned(),
                });
            };
            found.push((
                index,
                value,
                Origin::File {
                    path: path.clone(),
                    key,
                },
            ));
        }
    }
    for (index, flag) in flags.iter().enumerate() {
        // HARNESS_LOG names the service's filter; RUST_LOG is the usual one.
        let value = value_of(&flag.env).or_else(|| {
            (flag.env == "HARNESS_LOG")
                .then(|| value_of("RUST_LOG"))
                .flatten()
        });
        if let Some(value) = value {
            found.retain(|(i, _, _)| *i != index);
            found.push((index, value, Origin::Environment(flag.env.clone())));
        }
    }

    let mut argv: Vec<OsString> = Vec::with_capacity(args.len() + found.len());
    argv.push(
        args.first()
            .cloned()
            .unwrap_or_else(|| command.get_name().into()),
    );
    for (index, value, _) in &found {
        argv.push(format!("--{}={value}", flags[*index].long).into());
    }
    argv.extend(args.iter().skip(1).cloned());

    let parser = command
        .clone()
        .args_override_self(true)
        .mut_args(|arg| arg.env(None::<&str>));
    match parser.try_get_matches_from(argv) {
        Ok(matches) => Ok(matches),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            // Rendered by the command as declared: with its variables.
            Err(ConfigError::Cli(
                command.try_get_matches_from(args).err().unwrap_or(e),
            ))
        }
        Err(e) => Err(name_the_source(e, &flags, |flag| {
            if given(flag) {
                return Some(Origin::CommandLine);
            }
            let index = flags.iter().position(|f| f.id == flag.id)?;
            found
                .iter()
                .rev()
                .find(|(i, _, _)| *i == index)
                .map(|(_, _, origin)| origin.clone())
        })),
    }
}

/// `command` with each setting's variable (see the module's comment) and
/// its value shown as `<KEY>`: the command the service parses and shows
/// in `--help`.
pub fn with_variables(command: Command) -> Command {
    command.mut_args(|arg| {
        // A setting's id is `section.key`.
        let Some((_, key)) = arg.get_id().as_str().split_once('.') else {
            return arg;
        };
        let shown = key.to_ascii_uppercase();
        let variable = match (arg.get_env(), arg.get_long()) {
            (None, Some(long)) => Some(variable(long)),
            _ => None,
        };
        let arg = arg.value_name(shown);
        match variable {
            Some(variable) => arg.env(variable),
            None => arg,
        }
    })
}

/// The variable of the setting whose flag is `--{long}`.
fn variable(long: &str) -> String {
    format!("HARNESS_{}", long.to_ascii_uppercase().replace('-', "_"))
}

/// The value of `--config PATH` or `--config=PATH` on the command line.
fn config_path(args: &[OsString]) -> Option<String> {
    let mut rest = args.iter().skip(1).take_while(|a| *a != "--");
    while let Some(arg) = rest.next() {
        let arg = arg.to_str()?;
        if arg == "--config" {
            return rest.next().and_then(|p| p.to_str()).map(str::to_owned);
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(path.to_owned());
        }
    }
    None
}

/// The settings of a TOML file as `(section.key, text)`: each section is a
/// table; a table value (prices) is handed on as JSON, a list joined by
/// commas; an empty string is left out (unset).
fn read_file(path: &str, sections: &[&str]) -> Result<Vec<(String, String)>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.to_owned(),
        source,
    })?;
    let table: toml::Table = toml::from_str(&text).map_err(|source| ConfigError::ParseFile {
        path: path.to_owned(),
        source: Box::new(source),
    })?;
    let mut settings = Vec::new();
    for (section, values) in table {
        let key_error = |key: String, reason: String| ConfigError::FileKey {
            path: path.to_owned(),
            key,
            reason,
        };
        let toml::Value::Table(values) = values else {
            return Err(key_error(
                section,
                format!("settings belong in a section: {}", sections.join(", ")),
            ));
        };
        if !sections.contains(&section.as_str()) {
            return Err(key_error(
                section,
                format!("no such section ({})", sections.join(", ")),
            ));
        }
        for (key, value) in values {
            let key = format!("{section}.{key}");
            let text = file_text(&value).map_err(|reason| key_error(key.clone(), reason))?;
            if !text.is_empty() {
                settings.push((key, text));
            }
        }
    }
    Ok(settings)
}

fn file_text(value: &toml::Value) -> Result<String, String> {
    Ok(match value {
        toml::Value::String(s) => s.trim().to_owned(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Datetime(d) => d.to_string(),
        // A list of tables (`[[tools.http]]`) is handed on as JSON.
        toml::Value::Array(items) if items.iter().any(toml::Value::is_table) => {
            serde_json::to_string(value).map_err(|e| e.to_string())?
        }
        toml::Value::Array(items) => items
            .iter()
            .map(file_text)
            .collect::<Result<Vec<_>, _>>()?
            .join(","),
        toml::Value::Table(_) => serde_json::to_string(value).map_err(|e| e.to_string())?,
    })
}

/// A value clap refused, named by where it came from: the variable, the
/// file's key or the flag.
fn name_the_source(
    error: clap::Error,
    flags: &[Flag],
    origin: impl Fn(&Flag) -> Option<Origin>,
) -> ConfigError {
    if !matches!(
        error.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return ConfigError::Cli(error);
    }
    let Some(ContextValue::String(arg)) = error.get(ContextKind::InvalidArg) else {
        return ConfigError::Cli(error);
    };
    let long = arg
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .trim_start_matches("--");
    let Some(flag) = flags.iter().find(|f| f.long == long) else {
        return ConfigError::Cli(error);
    };
    let name = match origin(flag) {
        Some(Origin::Environment(name)) => name,
        Some(Origin::File { path, key }) => format!("{key} in {path}"),
        Some(Origin::CommandLine) | None => format!("--{}", flag.long),
    };
    let value = match error.get(ContextKind::InvalidValue) {
        Some(ContextValue::String(value)) => value.clone(),
        _ => String::new(),
    };
    let reason = match (
        std::error::Error::source(&error),
        error.get(ContextKind::ValidValue),
    ) {
        (Some(source), _) => out_of_range(&source.to_string())
            .unwrap_or_else(|| format!("cannot use {value:?}: {source}")),
        (None, Some(ContextValue::Strings(valid))) => {
            format!("{value:?} is not one of {}", valid.join(", "))
        }
        _ => format!("cannot use {value:?}"),
    };
    ConfigError::Invalid { name, reason }
}

/// A ranged parser's refusal (`0 is not in 1..=100`, `5 is not in 1024..`)
/// as the range it asks for.
fn out_of_range(refusal: &str) -> Option<String> {
    let (_, range) = refusal.split_once(" is not in ")?;
    let (low, high) = range.split_once("..")?;
    let high = high.strip_prefix('=').unwrap_or(high);
    // An open range ends at its type's largest value.
    let open = high
        .parse::<u128>()
        .map_or(high.is_empty(), |high| high >= u128::from(u32::MAX));
    Some(if open {
        format!("must be at least {low}")
    } else {
        format!("must be between {low} and {high}")
    })
}
