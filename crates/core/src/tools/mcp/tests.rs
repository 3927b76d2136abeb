use super::*;
use rmcp::model::ToolAnnotations;

#[test]
fn the_effect_class_follows_the_hints_and_unknown_is_the_worst() {
    let with = |read_only, destructive, open_world| {
        let mut a = ToolAnnotations::new();
        a.read_only_hint = read_only;
        a.destructive_hint = destructive;
        a.open_world_hint = open_world;
        effect_of(Some(&a))
    };
    assert_eq!(effect_of(None), EffectClass::Destructive);
    assert_eq!(with(Some(true), None, None), EffectClass::ReadOnly);
    assert_eq!(with(None, None, None), EffectClass::Destructive);
    assert_eq!(
        with(Some(false), Some(true), Some(false)),
        EffectClass::Destructive
    );
    assert_eq!(
        with(Some(false), Some(false), Some(false)),
        EffectClass::LocalWrite
    );
    assert_eq!(with(Some(false), Some(false), None), EffectClass::Network);
}

#[test]
fn names_are_prefixed_and_declarations_checked() {
    assert_eq!(tool_name("files", "read.file"), "files__read_file");
    assert_eq!(tool_name("s", &"x".repeat(100)).len(), 64);
    for bad in [
        r#"[{"name": "a"}]"#,
        r#"[{"name": "a", "command": "x", "url": "http://x/"}]"#,
        r#"[{"name": "a b", "command": "x"}]"#,
        r#"[{"name": "a", "url": "ftp://x/"}]"#,
        r#"[{"name": "a", "command": "x"}, {"name": "a", "command": "y"}]"#,
        r#"[{"name": "a", "command": "x", "cmd": "y"}]"#,
    ] {
        assert!(bad.parse::<McpServerList>().is_err(), "{bad}");
    }
    let ok: McpServerList = r#"[{"name": "files", "command": "mcp-files", "args": ["--root", "/srv"], "env": {"TOKEN": "${FILES_TOKEN}"}}]"#
        .parse()
        .unwrap();
    assert!(!format!("{ok:?}").contains("FILES_TOKEN"));
}
