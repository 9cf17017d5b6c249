"""The built-in document of `swarmkv demo`: an original, fictional field report.

It is long enough (about 750 words) that prefilling it dominates a short answer, which is
the situation SwarmKV is built for, and it holds concrete facts the demo's questions ask
about. It ends with a newline so the document stops at a token boundary (see pipeline/nodes.py).
"""

from __future__ import annotations

DEMO_DOCUMENT = """\
Field Report: The Flood Defences of Port Alder

Port Alder is a fishing town of about 4,200 people on the estuary of the River Wren. The
town grew up around a stone harbour built in 1861, and most of its older houses stand on
low ground between the harbour wall and the railway embankment. This report describes the
defences the town has built against the sea and the river, how they performed during the
storm of 14 February, and what the council plans to change.

Geography and risk

The estuary narrows sharply just below the town, so a spring tide pushed by a westerly gale
can rise much faster at Port Alder than on the open coast. The highest tide on record
reached 5.9 metres above the local datum in 1953, when the harbour wall was overtopped and
more than three hundred homes were flooded. The river adds a second danger: after heavy rain
on the moors, the Wren can carry eight times its normal flow, and if that water arrives
while the tide is high it has nowhere to go.

The defences

The town relies on four main works. First, the harbour wall was raised by 1.2 metres in
1998 and now stands at 6.8 metres above datum. Second, a tidal barrier with two steel gates
was completed across the mouth of Mill Creek in 2011 at a cost of 14 million pounds; the
gates are closed whenever the forecast tide exceeds 5.2 metres. Third, a grass embankment
runs for 2.4 kilometres along the north bank of the river, protecting the allotments, the
primary school and the caravan park. Fourth, three pumping stations lift rainwater out of
the low streets when the gates are shut. The largest of these, at Quay Lane, can move 900
litres per second.

Maintenance is shared between the county council and a volunteer group called the Wren
Wardens, founded in 2003 by a retired lock keeper, Margaret Huxley. The Wardens walk the
embankment every month, clear the grilles in front of the pumping stations, and keep a log
of every crack and burrow they find. Their records helped the council discover in 2019 that
badgers had tunnelled into the embankment near the caravan park, a weakness that was
repaired before the winter.

The storm of 14 February

The storm arrived on a spring tide with winds gusting to 110 kilometres per hour. The
barrier gates at Mill Creek were closed at 4:40 in the morning, two hours before high
water. The tide peaked at 5.6 metres, the second highest level ever measured in the town.
The harbour wall held, although waves breaking over its crest flooded the car park on the
quay and damaged eleven fishing boats moored inside the harbour.

The weakest moment came at the Quay Lane pumping station. At 6:15 a power cut stopped two
of its three pumps, and water began to collect in Fore Street. The station's diesel
generator started automatically, but it could supply only one pump at full speed. Wren
Wardens and council staff set up two portable pumps borrowed from the fire service, and by
9:00 the street was clear. In total, nineteen houses and the ground floor of the public
library took in water, most of it less than thirty centimetres deep. Nobody was injured.

Lessons and plans

The council's review, published in April, praised the barrier and the early decision to
close it, and concluded that without the gates around six hundred homes would have been
flooded. It named the pumping stations as the weakest part of the system. The council has
therefore approved three measures. A second generator will be installed at Quay Lane by
next autumn, so that all three pumps can run during a power cut. The embankment will be
raised by half a metre along its lowest 800 metres, beside the caravan park. And the
library will move its archive of old photographs and parish records from the ground floor
to the first floor.

The review also recommended warning residents sooner. Until now, the town siren sounded
only when water was already in the streets. From next winter, households that sign up will
receive a text message six hours before any tide forecast to exceed 5.4 metres. The Wren
Wardens have offered to visit older residents who do not use mobile phones and to help
them prepare a flood kit with a torch, a radio, copies of important papers and a week of
any medicines they need.

For now, Port Alder remains one of the best protected small towns on this coast, but the
people who look after its defences say the February storm was a reminder that every part
of the system matters, down to a single pump on a dark morning.
"""

# (branch name, question): asked after the document as "\nQuestion: ...\nAnswer:".
DEMO_QUESTIONS: tuple[tuple[str, str], ...] = (
    ("q1", "How high did the tide peak during the storm of 14 February?"),
    ("q2", "What went wrong at the Quay Lane pumping station during the storm?"),
)
DEMO_N_PREDICT = 48
# Without these the small default model goes on to invent the next question itself.
DEMO_STOP: tuple[str, ...] = ("\n\n", "\nQuestion:")


def demo_prompt(question: str) -> str:
    """The branch prompt asking question after the document, in Question/Answer form."""
    return f"\nQuestion: {question}\nAnswer:"
