#!/usr/bin/env bash
# Fails when a chapter includes a file or an anchor that does not exist. mdBook only
# logs such includes and builds anyway (the book's own check-includes preprocessor
# catches them during the build too); this check names every one before building.
set -euo pipefail
cd "$(dirname "$0")/../book/src"
status=0
while IFS= read -r hit; do
  md=${hit%%:*}
  spec=$(echo "$hit" | sed 's/.*{{#\(include\|rustdoc_include\) \([^}]*\)}}.*/\2/')
  path=${spec%%:*}
  anchor=
  [ "$spec" != "$path" ] && anchor=${spec#*:}
  file="$(dirname "$md")/$path"
  if [ ! -f "$file" ]; then
    echo "book/src/$md: included file $path does not exist"; status=1; continue
  fi
  case "$anchor" in
    ''|[0-9]*) ;;  # whole file or line ranges
    *) grep -q "ANCHOR: $anchor\b" "$file" || { echo "book/src/$md: no anchor '$anchor' in $path"; status=1; } ;;
  esac
done < <(grep -rHo '{{#\(include\|rustdoc_include\) [^}]*}}' --include='*.md' . | sed 's|^\./||')
exit $status
