# Sourced by results/*/commands.sh: `copy_finished_runs SRC DEST LABEL` copies each
# finished run under the workdir SRC (a run folder with result.json) into DEST at the
# same relative path, its files only (RUN_FILES; never its checkpoints), so that a
# fresh clone skips those runs; test_translations.json is kept gzip'd (.json.gz, which
# the reports read: plain, a grid's translations took most of the tree), and so is
# every file GZIP_FILES names (default: test_translations.json alone; the
# learning-rate grids add attention.json, which none of their reports reads, to keep
# the tree that travels to a device small). Each run is named in a line
# `copied LABEL/<relative path>`.
RUN_FILES="attention.json config.json metrics.jsonl result.json significance.json test_translations.json"

copy_finished_runs() {  # SRC DEST LABEL
  local src="$1" dest="$2" label="$3" result run rel name
  [ -d "$src" ] || { echo "no $src: nothing of $label to copy"; return 0; }
  find "$src" -path '*/runs/*/result.json' | sort | while read -r result; do
    run=$(dirname "$result")
    rel=${run#"$src"/}
    mkdir -p "$dest/$rel"
    for name in $RUN_FILES; do
      if [ ! -f "$run/$name" ]; then continue; fi
      if [[ " ${GZIP_FILES:-test_translations.json} " == *" $name "* ]]; then
        gzip -9 -n -c "$run/$name" > "$dest/$rel/$name.gz"
        rm -f "$dest/$rel/$name"
      else
        cp "$run/$name" "$dest/$rel/"
      fi
    done
    echo "copied $label/$rel"
  done
}
