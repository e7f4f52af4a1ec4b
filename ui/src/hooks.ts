import { useCallback, useEffect, useRef, useState, useSyncExternalStore } from "react";

import { ApiError, airflowUrl, getJson } from "./api";

export interface Poll<T> {
  data: T | null;
  error: ApiError | null;
  /** true once polling stopped for good (an answer only the user can change: 401/403/404) */
  stopped: boolean;
  refresh: () => void;
}

/** GET `path` now and every `everyMs` while mounted, keeping the last good answer: React
 * patches the DOM with the new values, so nothing under the user is rebuilt (focus, text
 * selection, scroll positions survive). Stops on an answer asking again cannot change; backs
 * off while the server cannot be reached. A new `path` (filter, page) asks at once. */
export function usePoll<T>(path: string | null, everyMs: number | ((data: T) => number)): Poll<T> {
  const [data, setData] = useState<T | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [stopped, setStopped] = useState(false);
  const [tick, setTick] = useState(0);
  const every = useRef(everyMs);
  every.current = everyMs;

  useEffect(() => {
    if (path === null) return;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let failures = 0;
    const controller = new AbortController();
    setStopped(false);
    const run = async () => {
      let next: number | null = null;
      try {
        const value = await getJson<T>(path, controller.signal);
        setData(value);
        setError(null);
        failures = 0;
        next = typeof every.current === "function" ? every.current(value) : every.current;
      } catch (err) {
        if (controller.signal.aborted) return;
        const apiError = err instanceof ApiError ? err : new ApiError(String(err), 0);
        setError(apiError);
        if (apiError.retryable) {
          failures += 1;
          const base = typeof every.current === "number" ? every.current : 2000;
          next = Math.min(30_000, base * 2 ** Math.min(failures, 4));
        } else {
          setStopped(true);
        }
      }
      if (next !== null && !controller.signal.aborted) timer = setTimeout(run, next);
    };
    void run();
    return () => {
      controller.abort();
      if (timer) clearTimeout(timer);
    };
  }, [path, tick]);

  const refresh = useCallback(() => setTick((t) => t + 1), []);
  return { data, error, stopped, refresh };
}

function readTimezone(): string {
  const fallback = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  try {
    const raw = window.localStorage.getItem("timezone");
    if (!raw) return fallback;
    const value: unknown = JSON.parse(raw);
    if (typeof value !== "string") return fallback;
    new Intl.DateTimeFormat("en", { timeZone: value }); // throws on an unknown zone
    return value;
  } catch {
    return fallback;
  }
}

function subscribeTimezone(onChange: () => void): () => void {
  // Airflow's UI stores the zone picked in its user menu under localStorage "timezone" and
  // announces a change with a "local-storage" event (other tabs: "storage")
  window.addEventListener("local-storage", onChange);
  window.addEventListener("storage", onChange);
  return () => {
    window.removeEventListener("local-storage", onChange);
    window.removeEventListener("storage", onChange);
  };
}

/** The time zone Airflow's UI shows times in (its user menu's setting; the browser's zone
 * when none was picked, as Airflow does). */
export function useAirflowTimezone(): string {
  return useSyncExternalStore(subscribeTimezone, readTimezone, readTimezone);
}

/** Seconds since the epoch, ticking every `everyMs` (running durations). */
export function useNow(everyMs = 1000): number {
  const [now, setNow] = useState(() => Date.now() / 1000);
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now() / 1000), everyMs);
    return () => clearInterval(timer);
  }, [everyMs]);
  return now;
}

type Navigate = (to: string) => void;
interface RouterGlobals {
  useNavigate?: () => Navigate;
}

/** Airflow's router's navigate (its react-router, shared as globalThis.ReactRouterDOM), so a
 * link changes the page inside Airflow's UI without reloading it; a full load without it. */
export function useAirflowNavigate(): Navigate {
  const router = (globalThis as { ReactRouterDOM?: RouterGlobals }).ReactRouterDOM;
  const useNavigate = router?.useNavigate ?? (() => (to: string) => window.location.assign(airflowUrl(to)));
  return useNavigate();
}
