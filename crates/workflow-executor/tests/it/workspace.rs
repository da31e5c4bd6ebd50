//! Paths stay inside the workspace: `..`, absolute paths and symbolic links
//! that lead out are refused.

use crate::support::Dir;
use workflow_executor::{PathError, Workspace};

#[test]
fn relative_paths_resolve_inside() {
    let dir = Dir::new();
    dir.write("src/main.rs", "fn main() {}");
    let ws = Workspace::new(&dir.path).unwrap();
    let root = dir.path.canonicalize().unwrap();
    assert_eq!(ws.resolve("src/main.rs").unwrap(), root.join("src/main.rs"));
    assert_eq!(
        ws.resolve("./src/../src/new.rs").unwrap(),
        root.join("src/new.rs")
    );
    assert_eq!(ws.resolve("a/b/c.txt").unwrap(), root.join("a/b/c.txt"));
    let absolute = root.join("src/main.rs");
    assert_eq!(ws.resolve(absolute.to_str().unwrap()).unwrap(), absolute);
}

#[test]
fn traversal_and_absolute_paths_outside_are_refused() {
    let dir = Dir::new();
    let ws = Workspace::new(&dir.path).unwrap();
    for path in ["../x", "a/../../x", "/etc/passwd", "src/../../../etc"] {
        assert!(
            matches!(ws.resolve(path), Err(PathError::Outside(_))),
            "{path}"
        );
    }
    assert_eq!(ws.resolve(""), Err(PathError::Empty));
    assert_eq!(ws.resolve("a\0b"), Err(PathError::Nul));
}

#[cfg(unix)]
#[test]
fn symlinks_out_of_the_workspace_are_refused() {
    let dir = Dir::new();
    let outside = Dir::new();
    outside.write("secret.txt", "secret");
    dir.write("inside.txt", "ok");
    std::os::unix::fs::symlink(&outside.path, dir.path.join("escape")).unwrap();
    std::os::unix::fs::symlink(
        outside.path.join("secret.txt"),
        dir.path.join("secret-link"),
    )
    .unwrap();
    std::os::unix::fs::symlink(dir.path.join("inside.txt"), dir.path.join("inside-link")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", dir.path.join("dangling")).unwrap();
    let ws = Workspace::new(&dir.path).unwrap();
    assert!(matches!(
        ws.resolve("escape/secret.txt"),
        Err(PathError::Outside(_))
    ));
    assert!(matches!(
        ws.resolve("escape/new-file"),
        Err(PathError::Outside(_))
    ));
    assert!(matches!(
        ws.resolve("secret-link"),
        Err(PathError::Outside(_))
    ));
    assert!(ws.resolve("dangling").is_err());
    // A link that stays inside is fine.
    assert!(ws.resolve("inside-link").is_ok());
}
