// Grafana's dashboard schema (`@grafana/schema`, the types Grafana itself builds and saves dashboards with) as a
// dashboard's JSON carries it: a string enum (`ThresholdsMode`, `FieldColorModeId`, ...) is the union of its values.
// scripts/check-dashboards.sh assigns each grafana/*.json to `Wire<Dashboard>` and type-checks it: an unknown field,
// a missing required one or a value of the wrong kind is an error at its line.
import type { Dashboard } from '@grafana/schema';

export type Wire<T> = T extends string
  ? `${T}`
  : T extends readonly (infer U)[]
    ? Wire<U>[]
    : T extends object
      ? { [K in keyof T]: Wire<T[K]> }
      : T;

export type WireDashboard = Wire<Dashboard>;
