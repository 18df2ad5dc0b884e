//! The simulated disk's crash model: what a power loss and a process crash keep, directory
//! durability, and failed syncs.

use super::*;
use crate::storage::create_dir_durable;

fn write_synced(sim: &SimStorage, path: &Path, bytes: &[u8]) {
    let file = sim.open(path, OpenMode::CreateNew).unwrap();
    file.write_all_at(&[bytes], 0).unwrap();
    file.sync_data().unwrap();
    sim.sync_dir(path.parent().unwrap()).unwrap();
}

#[test]
fn a_process_crash_keeps_the_page_cache_and_a_power_loss_does_not() {
    let sim = SimStorage::new(1);
    create_dir_durable(&sim, Path::new("/"), Path::new("/d")).unwrap();
    let path = Path::new("/d/f");
    write_synced(&sim, path, b"durable");
    let file = sim.open(path, OpenMode::Existing).unwrap();
    file.write_all_at(&[b" cached"], 7).unwrap();
    sim.crash_now();
    sim.restart_process();
    assert!(file.size_bytes().is_err(), "handles from before the crash are stale");
    assert_eq!(sim.written_bytes(path).unwrap(), b"durable cached");
    sim.crash_now();
    sim.restart();
    assert_eq!(sim.written_bytes(path).unwrap(), b"durable");
}

/// A directory's entry is durable only once its parent is synced; a file in a directory that
/// did not survive does not survive either, however well it was synced itself.
#[test]
fn a_directory_survives_a_power_loss_only_if_its_parent_was_synced() {
    let cases: &[(&str, bool)] = &[("created durably", true), ("created without syncs", false)];
    for (name, durable) in cases {
        let sim = SimStorage::new(2);
        let dir = Path::new("/data/topics/7/0");
        if *durable {
            create_dir_durable(&sim, Path::new("/"), dir).unwrap();
        } else {
            sim.create_dir_all(dir).unwrap();
        }
        write_synced(&sim, &dir.join("seg"), b"acknowledged");
        sim.restart();
        assert_eq!(sim.exists(&dir.join("seg")).unwrap(), *durable, "{name}");
        assert_eq!(sim.exists(Path::new("/data")).unwrap(), *durable, "{name}");
    }
}

/// An earlier attempt created the innermost directory and stopped before syncing its parent:
/// the next attempt must still make it durable.
#[test]
fn a_half_made_directory_is_made_durable_by_the_next_attempt() {
    // Which levels an earlier attempt created (without syncing) before it stopped.
    let cases: &[&[&str]] = &[&["/data/a"], &["/data/a", "/data/a/b"], &["/data/a/b"]];
    for made in cases {
        let sim = SimStorage::new(3);
        create_dir_durable(&sim, Path::new("/"), Path::new("/data")).unwrap();
        for dir in *made {
            sim.create_dir_all(Path::new(dir)).unwrap();
        }
        create_dir_durable(&sim, Path::new("/data"), Path::new("/data/a/b/c")).unwrap();
        sim.restart();
        assert!(sim.exists(Path::new("/data/a/b/c")).unwrap(), "{made:?}");
    }
}

#[test]
fn a_failed_sync_leaves_clean_pages_that_only_dropping_the_cache_reveals() {
    let sim = SimStorage::new(4);
    create_dir_durable(&sim, Path::new("/"), Path::new("/d")).unwrap();
    let path = Path::new("/d/f");
    write_synced(&sim, path, b"durable");
    let file = sim.open(path, OpenMode::Existing).unwrap();
    file.write_all_at(&[b" lost"], 7).unwrap();
    sim.fail_next_syncs(1);
    assert!(file.sync_data().is_err());
    assert_eq!(sim.failed_sync_count(), 1);
    file.sync_data().unwrap();
    assert_eq!(sim.written_bytes(path).unwrap(), b"durable lost", "reads still see the pages");
    file.write_all_at(&[b"!"], 12).unwrap();
    file.drop_clean_cache().unwrap();
    let mut read = vec![0u8; 13];
    assert_eq!(file.read_at(&mut read, 0).unwrap(), 13);
    assert_eq!(&read, b"durable\0\0\0\0\0!", "dirty pages stay, clean ones come from the disk");
}

/// As on Linux, an open file outlives its name: writes and syncs through a handle whose file was
/// removed (or replaced under the same name) succeed and reach nothing anyone can open.
#[test]
fn a_removed_file_stays_writable_and_syncable_through_its_open_handle() {
    let sim = SimStorage::new(3);
    create_dir_durable(&sim, Path::new("/"), Path::new("/d")).unwrap();
    let path = Path::new("/d/f");
    write_synced(&sim, path, b"first");
    let open = sim.open(path, OpenMode::Existing).unwrap();
    sim.remove(path).unwrap();
    open.write_all_at(&[b"late"], 5).unwrap();
    open.sync_data().unwrap();
    assert!(!sim.exists(path).unwrap(), "the write did not bring the name back");
    write_synced(&sim, path, b"second");
    open.write_all_at(&[b"stale"], 0).unwrap();
    open.sync_data().unwrap();
    assert_eq!(sim.written_bytes(path).unwrap(), b"second", "the new file is untouched");
}
