"""Sans-IO core of the NRI protocol: mux frames, ttrpc frames and stream state.

Feed bytes to ``Connection.receive_data`` and get events back; send with
``send_request``/``send_response`` and write out ``data_to_send()``. This package
must not import asyncio, socket or os (tests/test_layering.py checks).
"""

from __future__ import annotations

from nri_plugin.nri.wire._bounded import bound_message as bound_message
from nri_plugin.nri.wire._bounded import clip as clip
from nri_plugin.nri.wire._connection import Connection as Connection
from nri_plugin.nri.wire._connection import ConnectionClosed as ConnectionClosed
from nri_plugin.nri.wire._connection import ConnectionState as ConnectionState
from nri_plugin.nri.wire._connection import RequestReceived as RequestReceived
from nri_plugin.nri.wire._connection import RequestRejected as RequestRejected
from nri_plugin.nri.wire._connection import ResponseReceived as ResponseReceived
from nri_plugin.nri.wire._connection import Role as Role
from nri_plugin.nri.wire._errors import FrameTooLargeError as FrameTooLargeError
from nri_plugin.nri.wire._errors import LocalProtocolError as LocalProtocolError
from nri_plugin.nri.wire._errors import MessageTooLargeError as MessageTooLargeError
from nri_plugin.nri.wire._errors import ProtocolError as ProtocolError
from nri_plugin.nri.wire._errors import RemoteProtocolError as RemoteProtocolError
from nri_plugin.nri.wire._ttrpc import MAX_DATA as MAX_DATA
from nri_plugin.nri.wire._ttrpc import Code as Code
