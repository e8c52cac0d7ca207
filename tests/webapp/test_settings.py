import os
import secrets
import subprocess
import sys
from pathlib import Path

from webapp.settings import physical_memory_mb

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION_ONLY = ("DEBUG", "SECRET_KEY", "SECRET_KEY_FILE", "SECURE_SSL_REDIRECT",
                   "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS",
                   "SECURE_HSTS_PRELOAD", "ALLOWED_HOSTS")


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run manage.py in a fresh process, so the settings are read from this environment."""
    # The browser tests' DJANGO_ALLOW_ASYNC_UNSAFE must not reach a production check.
    base = {k: v for k, v in os.environ.items()
            if k not in PRODUCTION_ONLY and k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


def test_the_production_profile_passes_check_deploy_without_warnings():
    result = manage("check", "--deploy", "--fail-level", "WARNING",
                    ARCHIPELAGO_PROFILE="production", SECRET_KEY=secrets.token_urlsafe(50))

    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNINGS" not in result.stdout + result.stderr


def test_the_production_profile_reads_the_secret_key_from_a_file(tmp_path):
    key_file = tmp_path / "secret_key"
    key_file.write_text(secrets.token_urlsafe(50) + "\n")

    result = manage("check", "--deploy", "--fail-level", "WARNING",
                    ARCHIPELAGO_PROFILE="production", SECRET_KEY_FILE=str(key_file))

    assert result.returncode == 0, result.stdout + result.stderr


def test_the_production_profile_refuses_to_start_without_a_secret_key():
    result = manage("check", ARCHIPELAGO_PROFILE="production")

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "SECRET_KEY" in result.stderr


def test_the_memory_the_hosts_declare_defaults_to_this_machines_and_is_read_from_the_env():
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    assert physical_memory_mb() == total
    script = ("from django.conf import settings; print(settings.REDIS_MAXMEMORY_MB, "
              "settings.SYNCD_HOST_MEMORY_MB, settings.ISLAND_HOST_MEMORY_MB)")

    defaults = manage("shell", "--no-imports", "-c", script)
    declared = manage("shell", "--no-imports", "-c", script, REDIS_MAXMEMORY_MB="512",
                      SYNCD_HOST_MEMORY_MB="1024", ISLAND_HOST_MEMORY_MB="2048")
    refused = manage("check", SYNCD_HOST_MEMORY_MB="0")

    assert defaults.stdout.split() == [str(total // 4), str(total), str(total)], \
        defaults.stderr
    assert declared.stdout.split() == ["512", "1024", "2048"], declared.stderr
    assert ("REDIS_MAXMEMORY_MB, SYNCD_HOST_MEMORY_MB and ISLAND_HOST_MEMORY_MB must be at "
            "least 1") in refused.stderr



def test_the_pool_size_is_auto_unless_a_number_and_the_eval_cpu_share_a_fraction():
    script = ("from django.conf import settings; "
              "print(settings.ISLAND_POOL_SIZE, settings.SYNCD_EVAL_CPU_SHARE)")

    defaults = manage("shell", "--no-imports", "-c", script)
    declared = manage("shell", "--no-imports", "-c", script, ISLAND_POOL_SIZE="3",
                      SYNCD_EVAL_CPU_SHARE="0.1")
    bad_size = manage("check", ISLAND_POOL_SIZE="some")
    bad_share = manage("check", SYNCD_EVAL_CPU_SHARE="2")

    assert defaults.stdout.split() == ["None", "0.02"], defaults.stderr
    assert declared.stdout.split() == ["3", "0.1"], declared.stderr
    assert "ISLAND_POOL_SIZE must be auto or a whole number of 0 or more" in bad_size.stderr
    assert "SYNCD_EVAL_CPU_SHARE must be above 0 and at most 1" in bad_share.stderr

def test_syncds_server_takes_a_certificate_with_its_key_and_an_https_address():
    half = manage("check", SYNCD_SERVE_CERT="/etc/ssl/syncd.pem")
    plain_url = manage("check", SYNCD_SERVE_CERT="/etc/ssl/syncd.pem",
                       SYNCD_SERVE_KEY="/etc/ssl/syncd.key",
                       SYNCD_SERVE_URL="http://syncd-1.example.com:8765")
    https_without = manage("check", SYNCD_SERVE_URL="https://syncd-1.example.com:8765")
    both = manage("check", SYNCD_SERVE_CERT="/etc/ssl/syncd.pem",
                  SYNCD_SERVE_KEY="/etc/ssl/syncd.key",
                  SYNCD_SERVE_URL="https://syncd-1.example.com:8765")

    assert "SYNCD_SERVE_CERT and SYNCD_SERVE_KEY go together" in half.stderr
    assert "SYNCD_SERVE_URL must start with https:// (SYNCD_SERVE_CERT is set)" \
        in plain_url.stderr
    assert "SYNCD_SERVE_URL must start with http://" in https_without.stderr
    assert both.returncode == 0, both.stderr


def test_sqlite_runs_in_wal_mode_with_a_busy_timeout(tmp_path):
    show = ("from django.db import connection; c = connection.cursor(); "
            "c.execute('PRAGMA journal_mode'); print(c.fetchone()[0]); "
            "c.execute('PRAGMA busy_timeout'); print(c.fetchone()[0])")

    database_url = f"sqlite:///{tmp_path / 'db.sqlite3'}"

    result = manage("shell", "--no-imports", "-c", show, DATABASE_URL=database_url)

    assert result.returncode == 0, result.stderr
    journal_mode, busy_timeout_ms = result.stdout.split()
    assert journal_mode == "wal"
    assert int(busy_timeout_ms) >= 5000
