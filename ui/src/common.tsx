import type { ReactNode } from "react";

import type { ApiError } from "./api";
import { airflowUrl } from "./api";
import type { Palette } from "./rules";
import { useAirflowNavigate } from "./hooks";

export function Badge({ palette, children, ...rest }: { palette: Palette; children: ReactNode; [data: `data-${string}`]: string }) {
  return (
    <span className="badge" data-palette={palette} {...rest}>
      {children}
    </span>
  );
}

/** A link to a page of Airflow's UI: a real href (open in a new tab works), and a click
 * navigates with Airflow's router, so the page stays inside Airflow (breadcrumb, tabs). */
export function AirflowLink({ to, children, className }: { to: string; children: ReactNode; className?: string }) {
  const navigate = useAirflowNavigate();
  return (
    <a
      className={className}
      href={airflowUrl(to)}
      onClick={(event) => {
        if (event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
        event.preventDefault();
        navigate(to);
      }}
    >
      {children}
    </a>
  );
}

/** An error as a styled message; a 401 with the link to Airflow's login page. */
export function ErrorMessage({ error, stale = false }: { error: ApiError; stale?: boolean }) {
  const login = error.status === 401 ? error.login || airflowUrl("auth/login") : null;
  return (
    <div className="message" role="alert" data-palette={stale ? "amber" : "failed"} data-status={error.status} data-reason={error.reason ?? ""}>
      {error.status === 401 ? "Your Airflow session has expired or you are logged out. " : null}
      {error.message}
      {stale ? " (showing the last answer; retrying)" : null}
      {login ? (
        <>
          {" "}
          <a href={`${login}${login.includes("?") ? "&" : "?"}next=${encodeURIComponent(window.location.href)}`}>Log in again</a>
        </>
      ) : null}
    </div>
  );
}
