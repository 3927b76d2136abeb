use super::*;

fn tool(url: &str) -> HttpToolConfig {
    serde_json::from_value(json!({"name": "t", "description": "d", "url": url})).unwrap()
}

#[test]
fn declarations_are_checked() {
    assert!(check(&tool("https://api.example/items/{id}?q={q}")).is_ok());
    for bad in [
        "https://{host}/items",
        "https://api.example:{port}/",
        "ftp://api.example/",
        "api.example/items",
        "https://api.example/{unclosed",
    ] {
        assert!(check(&tool(bad)).is_err(), "{bad}");
    }
    let list = r#"[{"name": "a", "description": "d", "url": "https://x.example/"},
                   {"name": "a", "description": "d", "url": "https://x.example/"}]"#;
    assert!(
        list.parse::<HttpToolList>()
            .unwrap_err()
            .contains("declared twice")
    );
    let unknown =
        r#"[{"name": "a", "description": "d", "url": "https://x.example/", "verb": "GET"}]"#;
    assert!(
        unknown
            .parse::<HttpToolList>()
            .unwrap_err()
            .contains("verb")
    );
}

#[test]
fn a_path_argument_is_one_segment_unless_declared_as_several() {
    let template = "https://x.example/projects/p1/tickets/{id}";
    for bad in ["", ".", "..", "a/b", "../../admin"] {
        let args = json!({"id": bad}).as_object().unwrap().clone();
        let refused = fill(template, &args, false).unwrap_err();
        assert_eq!(refused.kind, ToolErrorKind::InvalidInput, "{bad:?}");
    }
    let args = json!({"path": "docs/a b.md"}).as_object().unwrap().clone();
    assert_eq!(
        fill("https://x.example/files/{path*}", &args, false).unwrap(),
        "https://x.example/files/docs/a%20b.md"
    );
    for bad in ["docs/../secret", "docs//a", "/docs", "."] {
        let args = json!({"path": bad}).as_object().unwrap().clone();
        assert!(
            fill("https://x.example/files/{path*}", &args, false).is_err(),
            "{bad:?}"
        );
    }
    assert_eq!(fixed_prefix(template).unwrap(), "/projects/p1/tickets/");
    assert_eq!(
        fixed_prefix("https://x.example/files/{p*}").unwrap(),
        "/files/"
    );
    assert_eq!(fixed_prefix("https://x.example?q={q}").unwrap(), "/");
    assert_eq!(
        placeholders("https://x.example/{a}/{b*}?c={c}"),
        ["a", "b", "c"]
    );
}

#[test]
fn placeholders_are_filled_encoded_and_secrets_come_from_the_environment() {
    let args = json!({"id": "a/b c", "n": 3, "name": "b c~"})
        .as_object()
        .unwrap()
        .clone();
    assert_eq!(
        fill("https://x.example/items/{name}?n={n}", &args, false).unwrap(),
        "https://x.example/items/b%20c~?n=3"
    );
    assert!(fill("https://x.example/{missing}", &args, false).is_err());
    // A query value may hold anything: it is encoded.
    assert_eq!(
        fill("https://x.example/items?q={id}", &args, false).unwrap(),
        "https://x.example/items?q=a%2Fb%20c"
    );
    let env = |name: &str| (name == "TOKEN").then(|| "s3cret".to_owned());
    assert_eq!(expand("Bearer ${TOKEN}", &env).unwrap(), "Bearer s3cret");
    assert!(
        expand("Bearer ${OTHER}", &env)
            .unwrap_err()
            .contains("OTHER")
    );
    let config: HttpToolConfig = serde_json::from_value(json!({
        "name": "t", "description": "d", "url": "https://x.example/",
        "headers": {"Authorization": "Bearer ${TOKEN}"}
    }))
    .unwrap();
    assert!(!format!("{config:?}").contains("TOKEN"));
    assert!(HttpTool::new(&config, |_| None).is_err());
    assert!(HttpTool::new(&config, env).is_ok());
}
