#!/bin/sh
# Location mapping command for the master's location_mapping_cmd (seed: kudu-location-awareness,
# "Node labeling"). The master runs it without a shell, with the host appended last:
#
#   location_mapping_cmd = conf/location_mapping.sh conf/topology.txt
#   -> conf/location_mapping.sh conf/topology.txt <host>
#
# The topology file has one "<host-pattern> <location>" pair per line; patterns are shell
# globs, the first match wins, '#' starts a comment. Prints the location and exits 0, or
# prints an error on stderr and exits 1 when no line matches.
set -eu

if [ "$#" -eq 1 ]; then
  topology="$(dirname "$0")/topology.txt"
  host="$1"
elif [ "$#" -eq 2 ]; then
  topology="$1"
  host="$2"
else
  echo "usage: $0 [TOPOLOGY_FILE] HOST" >&2
  exit 2
fi

if [ ! -r "$topology" ]; then
  echo "cannot read topology file $topology" >&2
  exit 1
fi

while read -r pattern location rest; do
  case "$pattern" in
    ''|'#'*) continue ;;
  esac
  # shellcheck disable=SC2254  # the pattern is meant to be a glob
  case "$host" in
    $pattern)
      echo "$location"
      exit 0
      ;;
  esac
done < "$topology"

echo "no location for host $host in $topology" >&2
exit 1
