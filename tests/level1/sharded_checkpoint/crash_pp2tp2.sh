#!/usr/bin/env bash
# crash.sh's kill chain at pp=2 x tp=2 (4 processes, 4 rounds, 60 steps).
exec bash "$(dirname "$0")/crash.sh" "$1" pp2tp2
